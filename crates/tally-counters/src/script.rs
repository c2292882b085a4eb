//! Lua scripts run by SHA. Each script is a `.lua` file compiled into the binary, named, and
//! hashed once; [`Script::run`] sends EVALSHA and, when Redis answers NOSCRIPT (restarted, SCRIPT
//! FLUSH, failed over to a replica that never saw the script), loads it and sends it once more.
//! Values always travel as ARGV: script text never contains caller data.
//!
//! Each module that owns a script parses its reply into a type beside it.

use redis::{Cmd, FromRedisValue, RedisResult};

use crate::conn::Conn;

/// One Lua script: its name (for errors and metrics), its text and its SHA1.
#[derive(Debug, Clone)]
pub struct Script {
    name: &'static str,
    source: &'static str,
    sha: String,
}

impl Script {
    /// A script from its text (hashed here, once).
    pub fn new(name: &'static str, source: &'static str) -> Script {
        Script {
            name,
            source,
            sha: redis::Script::new(source).get_hash().to_string(),
        }
    }

    /// The script's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The script's text.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// SHA1 of the text, as EVALSHA wants it.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// `EVALSHA sha numkeys keys...`, ready for its ARGV.
    pub fn cmd<K: redis::ToRedisArgs>(&self, keys: &[K]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        cmd
    }

    /// SCRIPT LOAD (on every primary of a cluster).
    pub async fn load(&self, conn: &mut Conn) -> RedisResult<()> {
        let sha: String = conn
            .query(redis::cmd("SCRIPT").arg("LOAD").arg(self.source))
            .await?;
        debug_assert_eq!(sha, self.sha, "{}", self.name);
        Ok(())
    }

    /// Run `cmd` (built by [`Script::cmd`]); on NOSCRIPT load the script and run it once more.
    pub async fn run<T: FromRedisValue>(&self, conn: &mut Conn, cmd: &Cmd) -> RedisResult<T> {
        match conn.query(cmd).await {
            Err(e) if is_noscript(&e) => {
                self.load(conn).await?;
                conn.query(cmd).await
            }
            other => other,
        }
    }

    /// [`Script::run`], telling which server connection ran it too (see
    /// [`Conn::query_traced`]).
    pub async fn run_traced(
        &self,
        conn: &mut Conn,
        cmd: &Cmd,
    ) -> RedisResult<(redis::Value, Option<crate::conn::ServerConn>)> {
        match conn.query_traced(cmd).await {
            Err(e) if is_noscript(&e) => {
                self.load(conn).await?;
                conn.query_traced(cmd).await
            }
            other => other,
        }
    }
}

/// Whether Redis answered that it does not know the script's SHA.
pub fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT")
}

/// Parse a reply that must be an array of integers. An integer may come as a bulk string of
/// decimal digits: Lua numbers are doubles, so a script passes on a 64-bit value Redis stores
/// (a counter, a fencing token) as the string `GET` returned, and it is parsed exactly here.
pub fn int_array(value: &redis::Value) -> Result<Vec<i64>, ReplyShapeError> {
    match value {
        redis::Value::Array(items) => items.iter().map(int).collect(),
        other => Err(ReplyShapeError::NotArray(format!("{other:?}"))),
    }
}

/// One integer: an integer reply, or a bulk string holding one (see [`int_array`]).
pub fn int(value: &redis::Value) -> Result<i64, ReplyShapeError> {
    match value {
        redis::Value::Int(n) => Ok(*n),
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ReplyShapeError::NotInteger(format!("{value:?}"))),
        other => Err(ReplyShapeError::NotInteger(format!("{other:?}"))),
    }
}

/// A script reply that is not the shape its contract says (what came back, as Redis sent it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyShapeError {
    /// Not an array.
    #[error("expected an array, got {0}")]
    NotArray(String),
    /// Not an integer, nor a string of decimal digits.
    #[error("expected an integer, got {0}")]
    NotInteger(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn integers_come_as_integer_replies_or_exact_strings() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"9223372036854775806".to_vec()),
            Value::BulkString(b"-9007199254740993".to_vec()),
        ]);
        assert_eq!(
            int_array(&reply).unwrap(),
            [1, i64::MAX - 1, -9_007_199_254_740_993]
        );
        for bad in [
            &b"9.007199254741e+15"[..],
            b"9223372036854775808",
            b"",
            b" 1",
        ] {
            let reply = Value::Array(vec![Value::BulkString(bad.to_vec())]);
            assert!(int_array(&reply).is_err(), "{bad:?}");
        }
        assert!(int_array(&Value::Int(1)).is_err());
    }
}
