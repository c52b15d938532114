//! Attempts until the server's final word or the deadline: backoff from
//! 1 s doubling to 30 s with jitter, on connection loss, timeouts and 4xx
//! replies (E01004 "in progress" included). Every attempt sends the same
//! bytes, so an attempt after a lost reply is answered with a replay.

use std::time::{Duration, Instant};

use super::client::{self, Attempt, Server};
use super::spool::Envelope;

const FIRST_WAIT: Duration = Duration::from_secs(1);
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Bounds on each step of one attempt (connect, each command, the reply to
/// the final dot): the time left, within these.
const MIN_STEP: Duration = Duration::from_secs(5);
const MAX_STEP: Duration = Duration::from_secs(60);

/// The last attempt's outcome, and whether any attempt got as far as
/// sending the final dot (so the server may hold the message).
pub(super) struct Settled {
    pub last: Attempt,
    pub after_dot: bool,
}

pub(super) async fn until_settled(
    server: &Server,
    env: &Envelope,
    message: &[u8],
    deadline: Instant,
) -> Settled {
    let mut wait = FIRST_WAIT;
    let mut after_dot = false;
    let mut n = 0;
    loop {
        n += 1;
        let step = deadline
            .saturating_duration_since(Instant::now())
            .clamp(MIN_STEP, MAX_STEP);
        let last = client::attempt(server, env, message, step).await;
        let Attempt::Temporary {
            why,
            after_dot: sent,
        } = &last
        else {
            return Settled { last, after_dot };
        };
        after_dot |= sent;
        let pause = jittered(wait);
        if Instant::now() + pause > deadline {
            return Settled { last, after_dot };
        }
        eprintln!(
            "smtp-once send: attempt {n} failed ({why}); retrying in {:.1} s",
            pause.as_secs_f64()
        );
        tokio::time::sleep(pause).await;
        wait = (wait * 2).min(MAX_WAIT);
    }
}

/// `wait` scaled by a random factor in [0.75, 1.25), so that many clients
/// cut off at once do not come back at once.
fn jittered(wait: Duration) -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
    wait.mul_f64(0.75 + r / 2.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn jitter_stays_within_a_quarter() {
        for _ in 0..100 {
            let d = super::jittered(std::time::Duration::from_secs(4));
            assert!(d.as_millis() >= 3000 && d.as_millis() < 5000, "{d:?}");
        }
    }
}
