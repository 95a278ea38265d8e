//! Positions: opaque strings in the archive; PostgreSQL WAL LSNs by default (rule R2).

use std::cmp::Ordering;
use std::fmt;

/// A PostgreSQL WAL location.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Parses `X/Y` (hex halves, each at most 32 bits; any case, padded or not).
    pub fn parse(text: &str) -> Option<Lsn> {
        let (hi, lo) = text.split_once('/')?;
        let half = |s: &str| -> Option<u64> {
            if s.is_empty() || s.len() > 8 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            u64::from_str_radix(s, 16).ok()
        };
        Some(Lsn((half(hi)? << 32) | half(lo)?))
    }
}

impl std::str::FromStr for Lsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Lsn, String> {
        Lsn::parse(text).ok_or_else(|| {
            format!("{text:?} is not an LSN (two hex halves of at most 8 digits: 16/B374D848)")
        })
    }
}

/// laredo's spelling: uppercase hex, high half unpadded, low half padded to 8 digits (`0/016B3748`).
impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:08X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// Is this a valid position under the default comparator?
pub fn is_valid(position: &str) -> bool {
    Lsn::parse(position).is_some()
}

/// laredo's comparator: LSN order; invalid positions sort below every valid one and equal each other.
pub fn compare(a: &str, b: &str) -> Ordering {
    match (Lsn::parse(a), Lsn::parse(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        (None, None) => Ordering::Equal,
    }
}

/// Do two position strings name the same position (R2)? LSNs by value, anything else only
/// when identical.
pub fn same(a: &str, b: &str) -> bool {
    match (Lsn::parse(a), Lsn::parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The canonical form used to index positions for chain walks.
pub fn canonical(position: &str) -> String {
    match Lsn::parse(position) {
        Some(l) => l.to_string(),
        None => position.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_spellings() {
        assert_eq!(Lsn::parse("0/16B3748"), Lsn::parse("0/016B3748"));
        assert_eq!(
            Lsn::parse("1a/2b3c4d5e").unwrap().to_string(),
            "1A/2B3C4D5E"
        );
        assert_eq!(Lsn(0).to_string(), "0/00000000");
        assert!(Lsn::parse("").is_none());
        assert!(Lsn::parse("0/").is_none());
        assert!(Lsn::parse("/0").is_none());
        assert!(Lsn::parse("0/xyz").is_none());
        assert!(Lsn::parse("0/100000000").is_none());
    }

    #[test]
    fn lsns_order_by_value_not_by_text() {
        let l = |s| Lsn::parse(s).unwrap();
        assert!(l("0/16B3748") < l("1/0"));
        assert!(l("0/A") > l("0/9"));
        assert!(l("0/10") > l("0/9"));
        assert_eq!(Lsn::parse("nope"), None);
        assert_eq!(
            "0/016b3748".parse::<Lsn>().unwrap().to_string(),
            "0/016B3748"
        );
        let e = "16/".parse::<Lsn>().unwrap_err();
        assert!(e.contains("\"16/\""), "{e}");
    }

    #[test]
    fn comparator() {
        assert_eq!(compare("0/10", "0/2"), Ordering::Greater);
        assert_eq!(compare("1/0", "0/FFFFFFFF"), Ordering::Greater);
        assert_eq!(compare("", "0/0"), Ordering::Less);
        assert_eq!(compare("<nil>", ""), Ordering::Equal);
        assert!(same("0/16B3748", "0/016B3748"));
        assert!(!same("<nil>", ""));
        assert!(same("x", "x"));
    }
}
