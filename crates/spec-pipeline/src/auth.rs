//! The link handshake: MLX's ring connects whatever answers at a rank's
//! address, and the protocol's magic number is no proof of anything, so
//! before any pipeline message every link proves that both ends hold the
//! secret `mlx-spec launch` generated for this job.
//!
//! Per link, lower rank `lo`, higher rank `hi = lo + 1`, in this order (a
//! ring send blocks until the peer receives, so both ends must agree on it):
//! 1. `lo` sends a fresh nonce;
//! 2. `hi` sends its own fresh nonce and its proof;
//! 3. `lo` checks that proof and sends its own (all zeros if `hi`'s failed,
//!    so that `hi` fails too instead of waiting).
//!
//! A proof is HMAC-SHA256 under the secret of the role (`lo` or `hi`, so a
//! proof cannot be reflected back), both ranks and both nonces (so it
//! cannot be replayed on another link or in another job). Each rank
//! authenticates its link to the rank before it first, then the one after:
//! the chain `0 -> 1 -> .. -> N-1` completes without waiting in a circle.

use hmac::{Hmac, Mac};
use mlx_distributed::Group;
use mlx_rs::Dtype;
use sha2::Sha256;

use crate::link::{recv, send};
use crate::PipelineError;

/// The environment variable carrying the secret to a rank (`mlx-spec launch`
/// sets it; an environment stays off the command line that `ps` shows).
pub const SECRET_ENV: &str = "MLX_SPEC_PIPELINE_SECRET";

/// Bytes of a secret, a nonce and a proof.
const LEN: usize = 32;

/// The job's shared secret. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct PipelineSecret([u8; LEN]);

impl std::fmt::Debug for PipelineSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PipelineSecret(..)")
    }
}

fn random() -> Result<[u8; LEN], PipelineError> {
    let mut bytes = [0u8; LEN];
    getrandom::fill(&mut bytes).map_err(PipelineError::NoRandom)?;
    Ok(bytes)
}

impl PipelineSecret {
    /// A new random secret (the system's random source).
    pub fn generate() -> Result<Self, PipelineError> {
        random().map(Self)
    }

    /// The secret as 64 lowercase hex digits (how [`SECRET_ENV`] holds it).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads 64 hex digits back; anything else is refused (a short or
    /// mistyped secret would otherwise fail only at the handshake).
    pub fn from_hex(text: &str) -> Result<Self, PipelineError> {
        let text = text.trim();
        let bad = || {
            PipelineError::Auth(format!(
                "{SECRET_ENV} must hold {} hex digits, got {} characters",
                2 * LEN,
                text.len()
            ))
        };
        if text.len() != 2 * LEN || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; LEN];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(bytes))
    }

    /// The secret from [`SECRET_ENV`]; its absence is an error saying how a
    /// rank is started.
    pub fn from_env() -> Result<Self, PipelineError> {
        match std::env::var(SECRET_ENV) {
            Ok(text) => Self::from_hex(&text),
            Err(_) => Err(PipelineError::Auth(format!(
                "no pipeline secret: start the ranks with `mlx-spec launch`, which generates \
                 one and passes it to every rank in {SECRET_ENV} (64 hex digits, the same on \
                 every rank)"
            ))),
        }
    }

    /// The proof that the end playing `role` of link `lo`-`hi` holds the
    /// secret, over both nonces.
    fn proof(&self, role: &[u8], lo: usize, hi: usize, nonces: (&[u8], &[u8])) -> [u8; LEN] {
        self.mac(role, lo, hi, nonces)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is the `role` end's, compared in constant time.
    fn check(
        &self,
        role: &[u8],
        lo: usize,
        hi: usize,
        nonces: (&[u8], &[u8]),
        proof: &[u8],
    ) -> bool {
        self.mac(role, lo, hi, nonces).verify_slice(proof).is_ok()
    }

    fn mac(&self, role: &[u8], lo: usize, hi: usize, nonces: (&[u8], &[u8])) -> Hmac<Sha256> {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
        mac.update(b"mlx-spec pipeline link v1\0");
        mac.update(role);
        mac.update(&(lo as u64).to_le_bytes());
        mac.update(&(hi as u64).to_le_bytes());
        mac.update(nonces.0);
        mac.update(nonces.1);
        mac
    }
}

const LO: &[u8] = b"lo";
const HI: &[u8] = b"hi";

fn words(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(words: &[i32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn send_bytes(group: &Group, data: &[u8], peer: usize) -> Result<(), PipelineError> {
    let w = words(data);
    send(
        group,
        &mlx_rs::Array::from_slice(&w, &[w.len() as i32]),
        peer,
    )?;
    Ok(())
}

fn recv_bytes(group: &Group, len: usize, peer: usize) -> Result<Vec<u8>, PipelineError> {
    let x = recv(group, &[(len / 4) as i32], Dtype::Int32, peer)?;
    Ok(bytes(x.as_slice::<i32>()))
}

fn refused(rank: usize, peer: usize) -> PipelineError {
    PipelineError::Auth(format!(
        "rank {rank}: rank {peer} failed the link handshake: the two do not hold the same \
         pipeline secret ({SECRET_ENV}); refusing the link"
    ))
}

/// The lower end of link `rank`-`rank + 1`.
fn as_lower(group: &Group, secret: &PipelineSecret, rank: usize) -> Result<(), PipelineError> {
    let hi = rank + 1;
    let mine = random()?;
    send_bytes(group, &mine, hi)?;
    let answer = recv_bytes(group, 2 * LEN, hi)?;
    let (theirs, proof) = answer.split_at(LEN);
    let nonces = (&mine[..], theirs);
    if !secret.check(HI, rank, hi, nonces, proof) {
        // A refusal the peer can read, then the error; the zeros prove
        // nothing (a proof is all zeros with probability 2^-256).
        let _ = send_bytes(group, &[0; LEN], hi);
        return Err(refused(rank, hi));
    }
    send_bytes(group, &secret.proof(LO, rank, hi, nonces), hi)
}

/// The higher end of link `rank - 1`-`rank`.
fn as_higher(group: &Group, secret: &PipelineSecret, rank: usize) -> Result<(), PipelineError> {
    let lo = rank - 1;
    let theirs = recv_bytes(group, LEN, lo)?;
    let mine = random()?;
    let nonces = (&theirs[..], &mine[..]);
    let mut answer = mine.to_vec();
    answer.extend(secret.proof(HI, lo, rank, nonces));
    send_bytes(group, &answer, lo)?;
    let proof = recv_bytes(group, LEN, lo)?;
    if !secret.check(LO, lo, rank, nonces, &proof) {
        return Err(refused(rank, lo));
    }
    Ok(())
}

/// Authenticates this rank's links (to the rank before, then the rank
/// after) with `secret`. Call it on every rank right after joining and
/// before any pipeline message; a peer without the secret is refused with
/// an error naming both ranks.
pub fn authenticate(group: &Group, secret: &PipelineSecret) -> Result<(), PipelineError> {
    let (rank, size) = (group.rank(), group.size());
    if rank > 0 {
        as_higher(group, secret, rank)?;
    }
    if rank + 1 < size {
        as_lower(group, secret, rank)?;
    }
    tracing::debug!(rank, size, "pipeline links authenticated");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> PipelineSecret {
        PipelineSecret([byte; LEN])
    }

    #[test]
    fn secrets_round_trip_through_hex_and_bad_text_is_refused() {
        let s = PipelineSecret::generate().expect("random");
        assert_eq!(PipelineSecret::from_hex(&s.to_hex()).expect("hex"), s);
        assert_ne!(PipelineSecret::generate().expect("random"), s, "fresh");
        assert!(PipelineSecret::from_hex("abcd").is_err(), "short");
        assert!(
            PipelineSecret::from_hex(&"zz".repeat(LEN)).is_err(),
            "not hex"
        );
        assert!(
            PipelineSecret::from_hex(&"é".repeat(LEN)).is_err(),
            "not ascii"
        );
        assert_eq!(format!("{s:?}"), "PipelineSecret(..)");
    }

    #[test]
    fn a_proof_holds_only_for_its_secret_role_link_and_nonces() {
        let (a, b) = ([1u8; LEN], [2u8; LEN]);
        let s = secret(7);
        let proof = s.proof(HI, 0, 1, (&a, &b));
        assert!(s.check(HI, 0, 1, (&a, &b), &proof));
        assert!(!secret(8).check(HI, 0, 1, (&a, &b), &proof), "other secret");
        assert!(!s.check(LO, 0, 1, (&a, &b), &proof), "reflected");
        assert!(!s.check(HI, 1, 2, (&a, &b), &proof), "other link");
        assert!(!s.check(HI, 0, 1, (&b, &a), &proof), "other nonces");
        assert!(!s.check(HI, 0, 1, (&a, &b), &[0; LEN]), "the refusal");
        assert!(!s.check(HI, 0, 1, (&a, &b), &proof[..16]), "truncated");
    }

    #[test]
    fn bytes_travel_as_int32_words_unchanged() {
        let data: Vec<u8> = (0..=255u8).step_by(3).take(32).collect();
        assert_eq!(bytes(&words(&data)), data);
    }
}
