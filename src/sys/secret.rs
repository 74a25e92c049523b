//! `Token`: an auth token that cannot reach a log line, `status` or an error message.
//!
//! A redacting wrapper for auth tokens, so a token can never reach a log line,
//! `status`, or an error message by accident.

use std::fmt;

/// An editor's or the broker's auth token. `Debug` and `Display` print `<redacted>`;
/// the only way to the bytes is [`Token::expose`], used where the header is built or checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token read from a lockfile or minted by the broker.
    pub fn new(value: String) -> Self {
        Token(value)
    }

    /// The secret itself; call it only to build or check an auth header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares with a presented value in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        let mut diff = ours.len() ^ presented.len();
        for (i, b) in ours.iter().enumerate() {
            diff |= usize::from(b ^ presented.get(i).copied().unwrap_or(0));
        }
        diff == 0
    }

    /// A fresh 32-hex-char token from the OS CSPRNG (the shape claudecode.nvim uses).
    pub fn generate() -> std::io::Result<Self> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Token(hex))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_the_secret() {
        let t = Token::new("s3cret-token-value".into());
        assert_eq!(
            format!("{t} {t:?} {:?}", Some(&t)),
            "<redacted> <redacted> Some(<redacted>)"
        );
    }

    #[test]
    fn matches_only_the_exact_value() {
        let t = Token::new("abcdef".into());
        assert!(t.matches(b"abcdef"));
        assert!(!t.matches(b"abcdeg"));
        assert!(!t.matches(b"abcde"));
        assert!(!t.matches(b"abcdef0"));
        assert!(!t.matches(b""));
    }

    #[test]
    fn generated_tokens_differ() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_eq!(a.expose().len(), 32);
        assert_ne!(a, b);
    }
}
