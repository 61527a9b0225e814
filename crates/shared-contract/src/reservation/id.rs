//! The id of a reservation, as a client holds it: `r1.<subject digest, 64 hex>.<token, 32 hex>`.
//!
//! The subject digest is the first limit's: a provider keeps the reservation beside that
//! subject's state (on Redis, under its hash tag). The token is 128 random bits, so an id
//! cannot be guessed from others; a forged or mistyped id names no reservation. The parser is
//! strict (lowercase hex, exact lengths) and names what is wrong.

use std::fmt;
use std::str::FromStr;

use crate::ids::SubjectDigest;
use crate::lease::{LeaseToken, hex, unhex};

/// Why a reservation id text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReservationIdError {
    /// Not three `.`-separated parts, or longer than [`ReservationId::LEN`]; carries the text
    /// (clipped).
    #[error("reservation id must be r1.<64 hex subject digest>.<32 hex token>, got {0:?}")]
    Shape(String),
    /// The first part is not `r1`; carries that part.
    #[error("reservation id version must be r1, got {0:?}")]
    Version(String),
    /// The subject part is not 64 lowercase hex digits; carries that part.
    #[error("reservation id subject digest must be 64 lowercase hex digits, got {0:?}")]
    Subject(String),
    /// The token part is not 32 lowercase hex digits; carries that part.
    #[error("reservation id token must be 32 lowercase hex digits, got {0:?}")]
    Token(String),
}

/// A reservation: where it is kept and its unguessable token.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ReservationId {
    /// The first limit's subject, beside whose state the reservation is kept.
    pub subject: SubjectDigest,
    /// The random token (the same kind as a lease's).
    pub token: LeaseToken,
}

impl ReservationId {
    /// Length of the text form: `r1.` + 64 + `.` + 32.
    pub const LEN: usize = 3 + 64 + 1 + 32;

    /// # Errors
    /// [`ReservationIdError`] naming the part that is wrong.
    pub fn parse(text: &str) -> Result<Self, ReservationIdError> {
        let clip = || text.chars().take(Self::LEN + 8).collect::<String>();
        if text.len() > Self::LEN {
            return Err(ReservationIdError::Shape(clip()));
        }
        let mut parts = text.split('.');
        let (Some(version), Some(subject), Some(token), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ReservationIdError::Shape(clip()));
        };
        if version != "r1" {
            return Err(ReservationIdError::Version(version.to_owned()));
        }
        let subject = unhex::<32>(subject)
            .map(SubjectDigest::from_bytes)
            .ok_or_else(|| ReservationIdError::Subject(subject.to_owned()))?;
        let token = unhex::<16>(token)
            .map(LeaseToken::from_bytes)
            .ok_or_else(|| ReservationIdError::Token(token.to_owned()))?;
        Ok(Self { subject, token })
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "r1.{}.{}",
            hex(self.subject.as_bytes()),
            self.token.to_hex()
        )
    }
}

impl FromStr for ReservationId {
    type Err = ReservationIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_back_as_written_and_bad_parts_are_named() {
        let id = ReservationId {
            subject: SubjectDigest::from_bytes([0xab; 32]),
            token: LeaseToken::from_bytes([7; 16]),
        };
        let text = id.to_string();
        assert_eq!(text.len(), ReservationId::LEN);
        assert_eq!(ReservationId::parse(&text), Ok(id));
        let bad = text.replacen("r1", "r2", 1);
        assert_eq!(
            ReservationId::parse(&bad),
            Err(ReservationIdError::Version("r2".into()))
        );
        let upper = format!("r1.{}.{}", "AB".repeat(32), "07".repeat(16));
        assert!(matches!(
            ReservationId::parse(&upper),
            Err(ReservationIdError::Subject(_))
        ));
        let short = format!("r1.{}.{}", "ab".repeat(32), "07".repeat(15));
        assert!(matches!(
            ReservationId::parse(&short),
            Err(ReservationIdError::Token(_))
        ));
        assert!(matches!(
            ReservationId::parse("r1.x"),
            Err(ReservationIdError::Shape(_))
        ));
        let long = "r".repeat(1_000_000);
        let Err(ReservationIdError::Shape(clipped)) = ReservationId::parse(&long) else {
            panic!("a long text is a shape error");
        };
        assert!(clipped.len() <= ReservationId::LEN + 8);
    }
}
