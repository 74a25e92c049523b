//! The hub socket's framing: a 4-byte little-endian length, then that many bytes of JSON.
//!
//! A frame's memory follows the bytes that came, never the header's claim: a length over
//! the cap is refused before anything is read, and a frame under it is read in pieces.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What reading a frame found instead of one.
#[derive(Debug, thiserror::Error)]
pub(super) enum FrameError {
    /// The header announced more than the cap (`max_frame_bytes`).
    #[error("a frame of {len} bytes is over the {max}-byte limit (max_frame_bytes)")]
    TooLarge {
        /// The announced length.
        len: u64,
        /// The cap.
        max: usize,
    },
    /// The peer closed in the middle of a frame.
    #[error("the connection closed in the middle of a frame")]
    Truncated,
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame: `Ok(None)` at a clean end of stream (between frames).
pub(super) async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    max: usize,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < header.len() {
        match rd.read(&mut header[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(FrameError::Truncated),
            n => got += n,
        }
    }
    let len = u32::from_le_bytes(header);
    let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
    if len_usize > max {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max,
        });
    }
    // At most 64 KiB up front; the rest grows as bytes arrive.
    let mut body = Vec::with_capacity(len_usize.min(64 * 1024));
    let read = rd.take(u64::from(len)).read_to_end(&mut body).await?;
    if read < len_usize {
        return Err(FrameError::Truncated);
    }
    Ok(Some(body))
}

/// Writes one frame (a payload over 4 GiB cannot be framed and is refused).
pub(super) async fn write_frame<W: AsyncWrite + Unpin>(
    wr: &mut W,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a hub frame cannot exceed 4 GiB",
        )
    })?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    wr.write_all(&buf).await?;
    wr.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_round_trips_and_a_clean_end_is_none() {
        let mut out = Vec::new();
        write_frame(&mut out, br#"{"type":"request"}"#)
            .await
            .unwrap();
        assert_eq!(&out[..4], &18u32.to_le_bytes());
        let mut rd = &out[..];
        let f = read_frame(&mut rd, 1024).await.unwrap().unwrap();
        assert_eq!(f, br#"{"type":"request"}"#);
        assert!(read_frame(&mut rd, 1024).await.unwrap().is_none());
    }

    /// The cap is checked against the header before any body is read or allocated.
    #[tokio::test]
    async fn a_length_over_the_cap_is_refused_before_reading() {
        let mut bytes = u32::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let err = read_frame(&mut &bytes[..], 1024).await.unwrap_err();
        assert!(
            matches!(err, FrameError::TooLarge { len, max: 1024 } if len == u64::from(u32::MAX))
        );
        // Exactly the cap is allowed.
        let mut ok = 2u32.to_le_bytes().to_vec();
        ok.extend_from_slice(b"{}");
        assert!(read_frame(&mut &ok[..], 2).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_cut_frame_is_truncated_not_a_clean_end() {
        let mut bytes = 10u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        assert!(matches!(
            read_frame(&mut &bytes[..], 1024).await,
            Err(FrameError::Truncated)
        ));
        assert!(matches!(
            read_frame(&mut &[1u8, 0][..], 1024).await,
            Err(FrameError::Truncated)
        ));
    }
}
