//! The RSA keys of the providers that sign with SHA256withRSA (PKCS#1 v1.5), Alipay's RSA2 and
//! WeChat Pay's `WECHATPAY2-SHA256-RSA2048`: a private key that signs ([`PrivateKey`]), a public
//! key that verifies ([`PublicKey`]), both read from PEM or the bare base64 the providers' key
//! tools write. Nothing here ever shows a key's content: not `Debug`, not an error.

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, RsaKeyPair, UnparsedPublicKey};

use crate::config::Secret;

/// A private RSA key of 2048 bits or more that signs.
pub struct PrivateKey {
    key: RsaKeyPair,
    rng: SystemRandom,
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey([redacted])")
    }
}

impl PrivateKey {
    /// SHA256withRSA (PKCS#1 v1.5) of `content`, base64.
    pub fn sign(&self, content: &[u8]) -> String {
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(
                &signature::RSA_PKCS1_SHA256,
                &self.rng,
                content,
                &mut signature,
            )
            .expect("signing with a parsed RSA key");
        base64::engine::general_purpose::STANDARD.encode(signature)
    }
}

/// An RSA public key (its PKCS#1 `RSAPublicKey` DER) that verifies.
#[derive(Clone)]
pub struct PublicKey(Vec<u8>);

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublicKey")
    }
}

impl PublicKey {
    /// Whether `signature` (base64) is this key's SHA256withRSA signature of `content`.
    pub fn verifies(&self, content: &[u8], signature: &str) -> bool {
        let Ok(signature) = base64::engine::general_purpose::STANDARD.decode(signature.trim())
        else {
            return false;
        };
        UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, &self.0)
            .verify(content, &signature)
            .is_ok()
    }
}

/// The DER inside a PEM text, or of bare base64 (as Alipay's key tool writes keys).
fn der_of(text: &str) -> Result<Vec<u8>, String> {
    let body: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("-----"))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| "not PEM or base64".to_string())
}

/// A private key: PKCS#8 or PKCS#1, PEM or bare base64, 2048 bits or more.
///
/// # Errors
/// What is wrong with it, never its content.
pub fn private_key(secret: &Secret) -> Result<PrivateKey, String> {
    let der = der_of(secret.expose())?;
    let key = RsaKeyPair::from_pkcs8(&der)
        .or_else(|_| RsaKeyPair::from_der(&der))
        .map_err(|e| {
            format!("not an RSA private key of 2048 bits or more (PKCS#8 or PKCS#1): {e}")
        })?;
    Ok(PrivateKey {
        key,
        rng: SystemRandom::new(),
    })
}

/// A public key: an X.509 `SubjectPublicKeyInfo` (`BEGIN PUBLIC KEY`, or the bare base64 the
/// providers' platforms show), a PKCS#1 `RSAPublicKey`, or the key of an X.509 certificate
/// (`BEGIN CERTIFICATE`, e.g. a WeChat Pay platform certificate).
///
/// # Errors
/// What is wrong with it, never its content.
pub fn public_key(secret: &Secret) -> Result<PublicKey, String> {
    let der = der_of(secret.expose())?;
    let rsa = spki_rsa_key(&der)
        .or_else(|| certificate_spki(&der).and_then(spki_rsa_key))
        .unwrap_or(der);
    // `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`, 2048 bits or
    // more: a key that verifies nothing is caught at start-up, not at the first answer.
    let modulus = der_element(&rsa, 0x30)
        .filter(|(_, after)| after.is_empty())
        .and_then(|(seq, _)| der_element(seq, 0x02))
        .filter(|(_, exponent)| der_element(exponent, 0x02).is_some());
    match modulus {
        Some((n, _)) if n.len() >= 256 => Ok(PublicKey(rsa)),
        Some(_) => Err("an RSA public key shorter than 2048 bits (RSA2 needs 2048)".into()),
        None => Err(
            "not an RSA public key (SubjectPublicKeyInfo, PKCS#1 or an X.509 certificate)".into(),
        ),
    }
}

/// The `RSAPublicKey` inside a `SubjectPublicKeyInfo` whose algorithm is rsaEncryption.
fn spki_rsa_key(der: &[u8]) -> Option<Vec<u8>> {
    const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    let (spki, _) = der_element(der, 0x30)?;
    let (algorithm, rest) = der_element(spki, 0x30)?;
    let (oid, _) = der_element(algorithm, 0x06)?;
    if oid != RSA_ENCRYPTION {
        return None;
    }
    let (bits, _) = der_element(rest, 0x03)?;
    match bits.split_first() {
        Some((0, key)) => Some(key.to_vec()),
        _ => None,
    }
}

/// The whole `SubjectPublicKeyInfo` element of an X.509 certificate: `Certificate ::=
/// SEQUENCE { tbsCertificate SEQUENCE { [0] version, serialNumber, signature, issuer,
/// validity, subject, subjectPublicKeyInfo, … }, … }`.
fn certificate_spki(der: &[u8]) -> Option<&[u8]> {
    let (certificate, _) = der_element(der, 0x30)?;
    let (mut tbs, _) = der_element(certificate, 0x30)?;
    if let Some((_, after)) = der_element(tbs, 0xa0) {
        tbs = after;
    }
    // serialNumber, signature, issuer, validity, subject.
    for tag in [0x02, 0x30, 0x30, 0x30, 0x30] {
        tbs = der_element(tbs, tag)?.1;
    }
    let (_, after) = der_element(tbs, 0x30)?;
    Some(&tbs[..tbs.len() - after.len()])
}

/// The content of the DER element of tag `tag` at the start of `der`, and what follows it.
fn der_element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = der.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_refused_without_repeating_it() {
        assert!(public_key(&Secret::for_tests("not a key")).is_err());
        assert!(private_key(&Secret::for_tests("bm90IGEga2V5")).is_err());
        let e = private_key(&Secret::for_tests(
            "-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----",
        ))
        .err()
        .unwrap();
        assert!(!e.contains("QUJD"), "{e}");
    }
}
