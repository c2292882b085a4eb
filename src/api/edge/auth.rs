//! Who is calling: the bearer token (`http.token`, or `http.token_file`) admits a caller, and
//! the admin token (`http.admin_token`), when set, admits an admin (it is accepted wherever the
//! bearer token is). Without `http.admin_token` every admitted caller is an admin (as before it
//! existed). One check for both ports: HTTP reads `Authorization: Bearer …`, gRPC the same as
//! metadata (Envoy sends it from its `grpc_service.initial_metadata`).

use http::header::AUTHORIZATION;
use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::config::Tokens;

/// What the caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A bearer token is needed and none (or a wrong one) was sent.
    Denied,
    /// Count, decide, peek: nothing destructive.
    Caller {
        /// Whether an `Authorization` header was sent (a refusal is then 403, not 401).
        sent_credentials: bool,
    },
    /// Also reset, release, fill and locks.
    Admin,
}

/// The access the request's headers give.
pub fn check(tokens: &Tokens, headers: &HeaderMap) -> Access {
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().as_bytes());
    let matches = |secret: &Option<String>| {
        secret
            .as_deref()
            .is_some_and(|s| given.is_some_and(|g| same_secret(g, s.as_bytes())))
    };
    let admin = matches(&tokens.admin);
    if tokens.token.is_some() && !admin && !matches(&tokens.token) {
        return Access::Denied;
    }
    if admin || tokens.admin.is_none() {
        Access::Admin
    } else {
        Access::Caller {
            sent_credentials: headers.contains_key(AUTHORIZATION),
        }
    }
}

/// Equality whose time does not depend on where the inputs differ, so a token cannot be
/// guessed byte by byte from response times (only a different length shows).
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    given.ct_eq(secret).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cres", b"s3cret"));
        assert!(!same_secret(b"s3cre", b"s3cret"));
        assert!(!same_secret(b"s3cret\0", b"s3cret"));
        assert!(!same_secret(b"", b"s3cret"));
    }

    #[test]
    fn tokens_decide_the_access() {
        let open = Tokens::default();
        assert_eq!(check(&open, &headers(None)), Access::Admin);
        let token = Tokens {
            token: Some("t0k".into()),
            admin: None,
        };
        assert_eq!(check(&token, &headers(None)), Access::Denied);
        assert_eq!(check(&token, &headers(Some("Bearer t0"))), Access::Denied);
        assert_eq!(check(&token, &headers(Some("Basic t0k"))), Access::Denied);
        assert_eq!(check(&token, &headers(Some("bearer t0k"))), Access::Admin);
        let both = Tokens {
            token: Some("t0k".into()),
            admin: Some("adm".into()),
        };
        let caller = Access::Caller {
            sent_credentials: true,
        };
        assert_eq!(check(&both, &headers(Some("Bearer t0k"))), caller);
        assert_eq!(check(&both, &headers(Some("Bearer adm"))), Access::Admin);
        assert_eq!(check(&both, &headers(Some("Bearer nope"))), Access::Denied);
        let admin_only = Tokens {
            token: None,
            admin: Some("adm".into()),
        };
        let anonymous = Access::Caller {
            sent_credentials: false,
        };
        assert_eq!(check(&admin_only, &headers(None)), anonymous);
        assert_eq!(
            check(&admin_only, &headers(Some("Bearer adm"))),
            Access::Admin
        );
    }
}
