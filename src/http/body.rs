//! Reading a request body after the request was authenticated: under the
//! size limit, charged to the same in-flight memory budget as SMTP message
//! buffers (reserved before the bytes are kept), and at a minimum rate.
//!
//! The rate rule is Apache's `RequestReadTimeout body=20,MinRate=500`
//! shape: the body gets `grace` to start, and every `min_rate` bytes
//! received buy one more second. A client that trickles a byte every few
//! seconds is cut off after about `grace`, however large the body it
//! announced; a slow but honest upload goes on.

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::budget::{OverBudget, Reservation};

/// How a body must arrive.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub grace: Duration,
    /// Bytes per second, on average since the body began, after `grace`.
    pub min_rate: u64,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the body is over {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    OverBudget(OverBudget),
    #[error("the body arrived too slowly ({received} bytes in {elapsed:?})")]
    TooSlow { received: usize, elapsed: Duration },
    #[error("the body could not be read: {0}")]
    Read(String),
}

/// The whole body, its bytes held under `reservation` (which the caller
/// keeps until the request is answered).
pub(crate) async fn read(
    body: Body,
    limits: BodyLimits,
    reservation: &mut Reservation,
) -> Result<Vec<u8>, BodyError> {
    let started = Instant::now();
    let mut body = body;
    let mut out: Vec<u8> = Vec::new();
    loop {
        let deadline = started + limits.grace + earned(out.len(), limits.min_rate);
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(BodyError::TooSlow {
                    received: out.len(),
                    elapsed: started.elapsed(),
                });
            }
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.to_string())),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let total = out.len().saturating_add(data.len());
        if total > limits.max_bytes {
            return Err(BodyError::TooLarge(limits.max_bytes));
        }
        // Reserved before it is kept: the budget bounds what all requests
        // and SMTP sessions hold together.
        reservation.grow_to(total).map_err(BodyError::OverBudget)?;
        out.extend_from_slice(&data);
    }
}

/// The time `received` bytes have bought at `min_rate`.
fn earned(received: usize, min_rate: u64) -> Duration {
    if min_rate == 0 {
        return Duration::from_secs(u64::from(u32::MAX));
    }
    Duration::from_secs_f64(received as f64 / min_rate as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::InFlightBudget;

    fn limits() -> BodyLimits {
        BodyLimits {
            max_bytes: 100,
            grace: Duration::from_millis(200),
            min_rate: 1_000,
        }
    }

    #[tokio::test]
    async fn reads_a_body_and_holds_its_bytes() {
        let budget = InFlightBudget::new(1_000, 1_000);
        let mut r = budget.reservation(Some("a".into()));
        let got = read(Body::from("hello"), limits(), &mut r).await.unwrap();
        assert_eq!(got, b"hello");
        assert_eq!(budget.in_use(), 5);
        drop(r);
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn refuses_too_large_and_over_budget() {
        let budget = InFlightBudget::new(1_000, 1_000);
        let mut r = budget.reservation(None);
        let big = Body::from(vec![b'x'; 101]);
        assert!(matches!(
            read(big, limits(), &mut r).await,
            Err(BodyError::TooLarge(100))
        ));
        let small = InFlightBudget::new(10, 10);
        let mut r = small.reservation(None);
        assert!(matches!(
            read(Body::from(vec![b'x'; 50]), limits(), &mut r).await,
            Err(BodyError::OverBudget(_))
        ));
    }

    #[tokio::test]
    async fn a_trickle_is_cut_after_the_grace() {
        let budget = InFlightBudget::unlimited();
        let mut r = budget.reservation(None);
        let (mut tx, body) = {
            let (tx, rx) =
                tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(1);
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            (tx, Body::from_stream(stream))
        };
        let feeder = tokio::spawn(async move {
            loop {
                if tx
                    .send(Ok(axum::body::Bytes::from_static(b"x")))
                    .await
                    .is_err()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = &mut tx;
        });
        let started = std::time::Instant::now();
        let result = read(body, limits(), &mut r).await;
        feeder.abort();
        assert!(
            matches!(result, Err(BodyError::TooSlow { .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
