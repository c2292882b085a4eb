//! The name of a client certificate, for the logs: its first DNS or URI subject alternative
//! name (a SPIFFE id is a URI), else its subject's common name. rustls hands over the DER and
//! has no parser for it; this reads the few fields it needs and gives up (None) on anything
//! else. The certificate was verified in the handshake, so this never decides access.

use std::sync::Arc;

/// Longest name kept; a longer one is cut (the log is for a human).
const MAX_NAME: usize = 256;

/// The name of the end-entity certificate `der`, if it has one that is printable ASCII.
pub(super) fn name(der: &[u8]) -> Option<Arc<str>> {
    let (_, certificate, _) = tlv(der)?;
    let (_, tbs, _) = tlv(certificate)?;
    let mut fields = DerFields(tbs);
    if fields.next()?.0 == 0xa0 {
        // [0] version came first: then serialNumber.
        fields.next()?;
    }
    // Then signature, issuer, validity, subject, subjectPublicKeyInfo.
    let _signature = fields.next()?;
    let _issuer = fields.next()?;
    let _validity = fields.next()?;
    let (_, subject) = fields.next()?;
    let _key = fields.next()?;
    let alternative = fields
        .find(|(tag, _)| *tag == 0xa3)
        .and_then(|(_, extensions)| alternative_name(extensions));
    alternative
        .or_else(|| common_name(subject))
        .map(|n| n[..n.len().min(MAX_NAME)].into())
}

/// The first DNS name or URI of the subjectAltName extension in `[3] EXPLICIT Extensions`.
fn alternative_name(explicit: &[u8]) -> Option<&str> {
    const SAN: &[u8] = &[0x55, 0x1d, 0x11];
    let (_, extensions, _) = tlv(explicit)?;
    DerFields(extensions).find_map(|(_, extension)| {
        let mut parts = DerFields(extension);
        let (_, oid) = parts.next()?;
        if oid != SAN {
            return None;
        }
        // critical BOOLEAN DEFAULT FALSE, then the OCTET STRING holding GeneralNames.
        let (_, value) = parts.find(|(tag, _)| *tag == 0x04)?;
        let (_, names, _) = tlv(value)?;
        DerFields(names)
            .find(|(tag, _)| matches!(tag, 0x82 | 0x86))
            .and_then(|(_, n)| printable(n))
    })
}

/// The commonName (2.5.4.3) of a Name.
fn common_name(name: &[u8]) -> Option<&str> {
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    DerFields(name).find_map(|(_, set)| {
        DerFields(set).find_map(|(_, pair)| {
            let mut parts = DerFields(pair);
            let (_, oid) = parts.next()?;
            (oid == CN)
                .then(|| parts.next())
                .flatten()
                .and_then(|(_, v)| printable(v))
        })
    })
}

fn printable(bytes: &[u8]) -> Option<&str> {
    let ok = !bytes.is_empty() && bytes.iter().all(|b| (0x20..0x7f).contains(b));
    ok.then(|| std::str::from_utf8(bytes).ok()).flatten()
}

/// The elements of a constructed value's contents, in order: (tag, contents).
struct DerFields<'a>(&'a [u8]);

impl<'a> Iterator for DerFields<'a> {
    type Item = (u8, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let (tag, contents, rest) = tlv(self.0)?;
        self.0 = rest;
        Some((tag, contents))
    }
}

/// One DER element of `input`: its (one-byte) tag, its contents, what follows it.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None; // a multi-byte tag: none of the fields read here
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    fn der(path: &std::path::Path) -> Vec<u8> {
        CertificateDer::from_pem_file(path).unwrap().to_vec()
    }

    #[test]
    fn a_certificate_is_named_by_its_dns_name_else_its_common_name() {
        let dir = std::env::temp_dir().join(format!("tally-client-cert-{}", std::process::id()));
        let pki = tally_testkit::certs::Pki::create(&dir, "names").unwrap();
        // IP:127.0.0.1 comes first: not a name.
        assert_eq!(name(&der(&pki.server.cert)).as_deref(), Some("localhost"));
        assert_eq!(
            name(&der(&pki.client.cert)).as_deref(),
            Some("tally-test-client")
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn garbage_has_no_name() {
        for bad in [
            &b""[..],
            b"\x30",
            b"\x30\x84\xff\xff\xff\xff",
            b"\x30\x02\x30\x00",
        ] {
            assert_eq!(name(bad), None);
        }
    }
}
