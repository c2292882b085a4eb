//! A private CA and certificates it signs, made with the `openssl` command (Debian's): for the
//! TLS and mutual-TLS tests and the TLS benchmark. EC P-256 keys (fast to make), valid two days.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA, a server certificate for `127.0.0.1`/`localhost` and a client certificate, all signed
/// by the CA.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The CA's certificate (what clients trust, and what a server checks client certificates
    /// against).
    pub ca: PathBuf,
    ca_key: PathBuf,
    pub server: Pair,
    pub client: Pair,
}

impl Pki {
    /// A new CA named `name` with its server and client certificates, in `dir` (files named
    /// `<name>-*.pem`).
    pub fn create(dir: &Path, name: &str) -> anyhow::Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let ca = dir.join(format!("{name}-ca.pem"));
        let ca_key = dir.join(format!("{name}-ca-key.pem"));
        openssl(
            Command::new("openssl")
                .args(["req", "-x509", "-days", "2", "-nodes"])
                .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
                .args(["-subj", &format!("/CN={name} test CA")])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
                .arg("-keyout")
                .arg(&ca_key)
                .arg("-out")
                .arg(&ca),
        )?;
        let mut pki = Pki {
            ca,
            ca_key,
            server: Pair {
                cert: PathBuf::new(),
                key: PathBuf::new(),
            },
            client: Pair {
                cert: PathBuf::new(),
                key: PathBuf::new(),
            },
        };
        pki.server = pki.sign(
            dir,
            &format!("{name}-server"),
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )?;
        pki.client = pki.sign(
            dir,
            &format!("{name}-client"),
            "tally-test-client",
            "extendedKeyUsage=clientAuth\n",
        )?;
        Ok(pki)
    }

    /// A key and a certificate for `cn` with the extensions `ext`, signed by the CA.
    fn sign(&self, dir: &Path, stem: &str, cn: &str, ext: &str) -> anyhow::Result<Pair> {
        let (key, csr, cert, extfile) = (
            dir.join(format!("{stem}-key.pem")),
            dir.join(format!("{stem}.csr")),
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.ext")),
        );
        std::fs::write(
            &extfile,
            format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{ext}"
            ),
        )?;
        openssl(
            Command::new("openssl")
                .args(["req", "-nodes", "-newkey", "ec"])
                .args(["-pkeyopt", "ec_paramgen_curve:prime256v1"])
                .args(["-subj", &format!("/CN={cn}")])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&csr),
        )?;
        openssl(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-set_serial"])
                .arg(rand::random::<u32>().to_string())
                .arg("-in")
                .arg(&csr)
                .arg("-CA")
                .arg(&self.ca)
                .arg("-CAkey")
                .arg(&self.ca_key)
                .arg("-extfile")
                .arg(&extfile)
                .arg("-out")
                .arg(&cert),
        )?;
        Ok(Pair { cert, key })
    }
}

fn openssl(command: &mut Command) -> anyhow::Result<()> {
    let out = command.output()?;
    anyhow::ensure!(
        out.status.success(),
        "openssl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
