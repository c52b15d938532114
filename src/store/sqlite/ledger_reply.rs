//! A ledger entry's reply, stored without its copy of the queue id.
//!
//! An acceptance's reply names its queue id (`250 2.0.0 Ok: queued as
//! 1K1QV5WN7ACQQ47`), which the entry's `queue_id` column holds too: 15 of
//! the entry's ~170 bytes, kept for every acceptance of the retention
//! (issue 24). A reply that contains its queue id is stored as `0x00`, the
//! id's byte offset (two bytes, big-endian) and the reply without the id.
//! A reply that does not is stored as written, unless it begins with
//! `0x00`: then `0x00 0xFF 0xFF` goes before it. So every entry written
//! before this (no channel's reply begins with `0x00`: SMTP and JSON are
//! text) reads back as it was written.

use std::borrow::Cow;

const MARK: u8 = 0x00;
/// The offset that says "no id taken out".
const WHOLE: u16 = u16::MAX;

/// What the `reply` column holds for `reply` under `queue_id`.
pub(super) fn pack<'a>(reply: &'a [u8], queue_id: Option<&str>) -> Cow<'a, [u8]> {
    let found = queue_id.filter(|id| !id.is_empty()).and_then(|id| {
        let at = find(reply, id.as_bytes())?;
        let offset = u16::try_from(at).ok().filter(|&o| o != WHOLE)?;
        Some((offset, id.len()))
    });
    match found {
        Some((offset, len)) => {
            let at = usize::from(offset);
            let mut out = Vec::with_capacity(reply.len() + 3 - len);
            out.push(MARK);
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(&reply[..at]);
            out.extend_from_slice(&reply[at + len..]);
            Cow::Owned(out)
        }
        None if reply.first() == Some(&MARK) => {
            let mut out = Vec::with_capacity(reply.len() + 3);
            out.push(MARK);
            out.extend_from_slice(&WHOLE.to_be_bytes());
            out.extend_from_slice(reply);
            Cow::Owned(out)
        }
        None => Cow::Borrowed(reply),
    }
}

/// The reply as written, from the column and the entry's `queue_id`.
pub(super) fn unpack(stored: Vec<u8>, queue_id: Option<&str>) -> Vec<u8> {
    let [MARK, hi, lo, rest @ ..] = stored.as_slice() else {
        return stored;
    };
    let offset = u16::from_be_bytes([*hi, *lo]);
    let at = usize::from(offset);
    match queue_id {
        _ if offset == WHOLE => rest.to_vec(),
        Some(id) if at <= rest.len() => [&rest[..at], id.as_bytes(), &rest[at..]].concat(),
        // Not written by `pack`: given back as stored.
        _ => stored,
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "1K1QV5WN7ACQQ47";

    fn round_trip(reply: &[u8], queue_id: Option<&str>) -> Vec<u8> {
        unpack(pack(reply, queue_id).into_owned(), queue_id)
    }

    #[test]
    fn the_queue_id_is_stored_once() {
        let reply = format!("250 2.0.0 Ok: queued as {ID}\r\n").into_bytes();
        let stored = pack(&reply, Some(ID));
        assert_eq!(stored.len(), reply.len() + 3 - ID.len());
        assert!(find(&stored, ID.as_bytes()).is_none());
        assert_eq!(round_trip(&reply, Some(ID)), reply);
    }

    #[test]
    fn every_reply_reads_back_as_written() {
        let with_id_first = format!("{ID} queued").into_bytes();
        let json = format!("{{\"queue_id\":\"{ID}\",\"status\":\"queued\"}}").into_bytes();
        let nul_first = [&[0u8, 1, 2][..], ID.as_bytes()].concat();
        let cases: [(&[u8], Option<&str>); 7] = [
            (b"550 5.7.1 refused\r\n", Some(ID)),
            (b"550 5.7.1 refused\r\n", None),
            (&with_id_first, Some(ID)),
            (&json, Some(ID)),
            (&nul_first, Some(ID)),
            (&[0u8, 0xFF, 0xFF, 9], None),
            (b"", Some(ID)),
        ];
        for (reply, id) in cases {
            assert_eq!(round_trip(reply, id), reply, "{reply:?}");
        }
    }

    #[test]
    fn entries_written_before_read_as_they_are() {
        let old = format!("250 2.0.0 Ok: queued as {ID}\r\n").into_bytes();
        assert_eq!(unpack(old.clone(), Some(ID)), old);
    }

    #[test]
    fn an_id_past_the_offset_range_is_kept_in_place() {
        let reply = [vec![b'x'; 70_000], ID.as_bytes().to_vec()].concat();
        assert_eq!(pack(&reply, Some(ID)).as_ref(), reply.as_slice());
        assert_eq!(round_trip(&reply, Some(ID)), reply);
    }
}
