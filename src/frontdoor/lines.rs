//! stdin read as lines of at most a cap, whatever arrives (the `mcp` and `acp` doors).

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line of stdin, or the news that one was too long.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A complete line (without its newline).
    Text(String),
    /// A line over the cap was discarded (up to and including its newline).
    TooLong,
}

/// Reads lines of at most `max` bytes; its buffer never grows past `max` whatever the input
/// (peak: that buffer and the half-size one it grew from).
pub(crate) struct CappedLines<R> {
    reader: R,
    max: usize,
    buf: Vec<u8>,
    discarding: bool,
}

impl<R: AsyncBufRead + Unpin> CappedLines<R> {
    /// Wraps `reader`.
    pub(crate) fn new(reader: R, max: usize) -> Self {
        CappedLines {
            reader,
            max,
            buf: Vec::new(),
            discarding: false,
        }
    }

    /// The next line; `None` at end of input.
    pub(crate) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let avail = self.reader.fill_buf().await?;
            if avail.is_empty() {
                if std::mem::take(&mut self.discarding) {
                    return Ok(Some(Line::TooLong));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.take_line()));
            }
            let newline = avail.iter().position(|b| *b == b'\n');
            let chunk = newline.map_or(avail.len(), |i| i);
            if !self.discarding {
                let needed = self.buf.len() + chunk;
                if needed > self.max {
                    self.discarding = true;
                    self.buf = Vec::new();
                } else {
                    if needed > self.buf.capacity() {
                        // Doubling, but never past the cap: a line near the cap holds one
                        // buffer of the cap's size (and the half-size one it was copied from,
                        // for a moment), not the next power of two on top.
                        let grown = needed.max(self.buf.capacity() * 2).min(self.max);
                        self.buf.reserve_exact(grown - self.buf.len());
                    }
                    self.buf.extend_from_slice(&avail[..chunk]);
                }
            }
            let used = newline.map_or(chunk, |i| i + 1);
            self.reader.consume(used);
            if newline.is_some() {
                if std::mem::take(&mut self.discarding) {
                    return Ok(Some(Line::TooLong));
                }
                return Ok(Some(self.take_line()));
            }
        }
    }

    fn take_line(&mut self) -> Line {
        let mut bytes = std::mem::take(&mut self.buf);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        Line::Text(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_capped_and_the_rest_goes_on() {
        let input = format!(
            "short\n{}\nnext\r\n{}",
            "x".repeat(100),
            "tail-without-a-newline-at-all"
        );
        let mut l = CappedLines::new(tokio::io::BufReader::with_capacity(7, input.as_bytes()), 20);
        assert_eq!(
            l.next_line().await.unwrap(),
            Some(Line::Text("short".into()))
        );
        assert_eq!(l.next_line().await.unwrap(), Some(Line::TooLong));
        assert_eq!(
            l.next_line().await.unwrap(),
            Some(Line::Text("next".into()))
        );
        assert_eq!(l.next_line().await.unwrap(), Some(Line::TooLong));
        assert_eq!(l.next_line().await.unwrap(), None);
        let mut exact = CappedLines::new(&b"12345\n123456\n"[..], 5);
        assert_eq!(
            exact.next_line().await.unwrap(),
            Some(Line::Text("12345".into()))
        );
        assert_eq!(exact.next_line().await.unwrap(), Some(Line::TooLong));
    }
}
