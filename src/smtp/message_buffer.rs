//! The buffer a session collects DATA or BDAT content in. It grows only
//! with bytes actually received (a `BDAT 26214000` announces, it does not
//! deliver), in bounded steps, and every byte of capacity is reserved from
//! the [`InFlightBudget`] before it is allocated.

use std::sync::Arc;

use crate::budget::{InFlightBudget, OverBudget, Reservation};

/// Smallest growth: the budget's counters are touched once per step, not
/// once per read.
const MIN_STEP: usize = 64 * 1024;
/// Largest growth: spare capacity (memory reserved but not yet filled) stays
/// small next to the message.
const MAX_STEP: usize = 4 * 1024 * 1024;

#[derive(Debug, Default)]
pub struct MessageBuffer {
    bytes: Vec<u8>,
    /// Covers the buffer's capacity, and after [`MessageBuffer::take`] the
    /// content handed out, until [`MessageBuffer::clear`].
    reservation: Option<Reservation>,
}

impl MessageBuffer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes held against the budget.
    pub fn reserved(&self) -> usize {
        self.reservation.as_ref().map_or(0, Reservation::bytes)
    }

    /// Makes room for `incoming` more bytes without the receiver having to
    /// reallocate: capacity grows by 1.5x, at least 64 KiB and at most
    /// 4 MiB at a time (and not past `limit` unless the bytes need it).
    pub fn make_room(
        &mut self,
        incoming: usize,
        limit: usize,
        budget: &Arc<InFlightBudget>,
        account: Option<&str>,
    ) -> Result<(), OverBudget> {
        let len = self.bytes.len();
        let capacity = self.bytes.capacity();
        let need = len.saturating_add(incoming);
        if need <= capacity {
            return Ok(());
        }
        let step = (capacity / 2).clamp(MIN_STEP, MAX_STEP);
        let target = capacity.saturating_add(step).min(limit).max(need);
        self.reservation
            .get_or_insert_with(|| budget.reservation(account.map(Arc::from)))
            .grow_to(target)?;
        self.bytes.reserve_exact(target - len);
        Ok(())
    }

    /// Where a receiver appends; call [`MessageBuffer::make_room`] first.
    pub fn vec(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// The content, handed out for submission. Its reservation stays here
    /// until [`MessageBuffer::clear`], so the acceptance pipeline's copy is
    /// counted while it works on it.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }

    /// Frees the content and returns its bytes to the budget.
    pub fn clear(&mut self) {
        self.bytes = Vec::new();
        self.reservation = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_received_bytes_in_bounded_steps() {
        let budget = InFlightBudget::unlimited();
        let mut buf = MessageBuffer::new();
        buf.make_room(10, usize::MAX, &budget, None).expect("room");
        assert_eq!(buf.reserved(), MIN_STEP);
        assert!(buf.vec().capacity() >= MIN_STEP);
        // 30 MiB arriving 16 KiB at a time: spare capacity never exceeds
        // one step.
        let chunk = vec![b'x'; 16 * 1024];
        for _ in 0..(30 * 64) {
            buf.make_room(chunk.len(), usize::MAX, &budget, None)
                .expect("room");
            buf.vec().extend_from_slice(&chunk);
            assert!(buf.reserved() - buf.len() <= MAX_STEP);
            assert_eq!(buf.vec().capacity(), buf.reserved());
        }
        assert_eq!(budget.in_use(), buf.reserved());
        let content = buf.take();
        assert_eq!(content.len(), 30 << 20);
        assert_eq!(budget.in_use(), buf.reserved(), "kept until clear");
        buf.clear();
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn refuses_past_the_budget_and_keeps_what_it_has() {
        let budget = InFlightBudget::new(100_000, usize::MAX);
        let mut buf = MessageBuffer::new();
        buf.make_room(1000, usize::MAX, &budget, None)
            .expect("room");
        buf.vec().extend_from_slice(&[b'a'; 1000]);
        let err = buf.make_room(MIN_STEP, usize::MAX, &budget, None);
        assert_eq!(err, Err(OverBudget::Global { limit: 100_000 }));
        assert_eq!(buf.len(), 1000);
        assert_eq!(budget.in_use(), MIN_STEP);
        drop(buf);
        assert_eq!(budget.in_use(), 0, "dropping the buffer returns its bytes");
    }

    #[test]
    fn limit_caps_spare_capacity_but_not_needed_bytes() {
        let budget = InFlightBudget::unlimited();
        let mut buf = MessageBuffer::new();
        buf.make_room(10, 1000, &budget, None).expect("room");
        assert_eq!(buf.reserved(), 1000);
        buf.make_room(5000, 1000, &budget, None).expect("room");
        assert_eq!(buf.reserved(), 5000);
    }
}
