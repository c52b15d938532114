//! Password checks on a fixed set of hashing threads.
//!
//! Each argon2id check needs `m_cost` KiB (19 MiB by default). Allocating
//! that per check let glibc keep the freed blocks per thread, so memory grew
//! with the number of guesses. Here each thread owns one block and reuses
//! it: memory is `hash_threads × m_cost`, however many clients guess at once.
//! A bounded number of jobs may wait; past that the caller is told `Busy`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use argon2::password_hash::phc::{Output, PasswordHash};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum HashError {
    #[error("not a PHC string ({0}); create one with `smtp-once hash-password`")]
    NotPhc(String),
    #[error("algorithm {0} is not argon2 (use `smtp-once hash-password`)")]
    NotArgon2(String),
    #[error("invalid argon2 parameters: {0}")]
    Params(String),
    #[error("the PHC string has no salt or no hash")]
    Incomplete,
}

/// A `password_hash` from the config, parsed once at startup.
#[derive(Debug)]
pub(super) struct StoredHash {
    algorithm: Algorithm,
    version: Version,
    params: Params,
    salt: Vec<u8>,
    expected: Output,
}

impl StoredHash {
    pub(super) fn parse(phc: &str) -> Result<Self, HashError> {
        let h = PasswordHash::new(phc).map_err(|e| HashError::NotPhc(e.to_string()))?;
        let algorithm = Algorithm::new(h.algorithm.as_str())
            .map_err(|_| HashError::NotArgon2(h.algorithm.to_string()))?;
        let version = match h.version {
            Some(v) => Version::try_from(v).map_err(|e| HashError::Params(e.to_string()))?,
            None => Version::default(),
        };
        let params = Params::try_from(&h).map_err(|e| HashError::Params(e.to_string()))?;
        let (Some(salt), Some(expected)) = (h.salt, h.hash) else {
            return Err(HashError::Incomplete);
        };
        Ok(Self {
            algorithm,
            version,
            params,
            salt: salt.to_vec(),
            expected,
        })
    }

    /// Hashes `password` into `memory` (grown once to the size this hash
    /// needs) and compares in constant time.
    fn matches(&self, password: &[u8], memory: &mut Vec<Block>) -> bool {
        let blocks = self.params.block_count();
        if memory.len() < blocks {
            memory.reserve_exact(blocks.max(MMAP_FLOOR_BLOCKS) - memory.len());
            memory.resize(blocks, Block::new());
        }
        let argon2 = Argon2::new(self.algorithm, self.version, self.params.clone());
        let mut buf = [0u8; Output::MAX_LENGTH];
        let Some(out) = buf.get_mut(..self.expected.len()) else {
            return false;
        };
        if argon2
            .hash_password_into_with_memory(password, &self.salt, out, &mut memory[..blocks])
            .is_err()
        {
            return false;
        }
        // `Output`'s equality is constant-time.
        Output::new(out).is_ok_and(|got| got == self.expected)
    }
}

/// glibc serves allocations above its mmap threshold with their own
/// mapping and unmaps them on free, but after such a free it raises the
/// threshold to that size (up to 32 MiB), so the next 19 MiB block comes
/// from a per-thread arena and stays resident for good: the original leak.
/// Reserving more than 32 MiB (virtual; only the blocks in use are
/// touched) keeps every block its own mapping, returned to the system
/// when the thread frees it.
const MMAP_FLOOR_BLOCKS: usize = (32 << 20) / Block::SIZE + 256;

/// The hashing threads are all busy and the wait queue is full.
#[derive(Debug)]
pub(super) struct Busy;

/// The fixed pool of hashing threads with its bounded queue.
pub(super) struct HashPool {
    jobs: mpsc::Sender<Job>,
    /// Jobs sent and not yet taken by a thread.
    waiting: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    capacity: usize,
}

struct Job {
    hash: Arc<StoredHash>,
    password: Vec<u8>,
    reply: oneshot::Sender<bool>,
    slot: Slot,
}

/// One of the `threads + queue` places. The job owns it, so it is given
/// back only once the thread has finished with the job, never earlier
/// because the client went away.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl HashPool {
    pub(super) fn start(threads: usize, queue: usize) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let waiting = Arc::new(AtomicUsize::new(0));
        for i in 0..threads.max(1) {
            let (rx, waiting) = (rx.clone(), waiting.clone());
            std::thread::Builder::new()
                .name(format!("auth-hash-{i}"))
                .spawn(move || hashing_thread(&rx, &waiting))?;
        }
        Ok(Self {
            jobs,
            waiting,
            in_flight: Arc::new(AtomicUsize::new(0)),
            capacity: threads.max(1) + queue,
        })
    }

    /// Whether `password` matches `hash`, computed on a hashing thread.
    pub(super) async fn verify(&self, hash: Arc<StoredHash>, password: &str) -> Result<bool, Busy> {
        let slot = self.take_slot().ok_or(Busy)?;
        let (reply, answer) = oneshot::channel();
        let job = Job {
            hash,
            password: password.as_bytes().to_vec(),
            reply,
            slot,
        };
        self.waiting.fetch_add(1, Ordering::AcqRel);
        if self.jobs.send(job).is_err() {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Busy);
        }
        answer.await.map_err(|_| Busy)
    }

    fn take_slot(&self) -> Option<Slot> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(self.in_flight.clone()))
    }
}

/// Keeps its memory block while jobs are waiting, and gives it back to the
/// system whenever none are, so an attack leaves no residue. (Checked
/// before taking the lock: a thread may wait for the lock a long time while
/// another one sits in `recv` holding it.)
fn hashing_thread(jobs: &Mutex<mpsc::Receiver<Job>>, waiting: &AtomicUsize) {
    let mut memory: Vec<Block> = Vec::new();
    loop {
        if waiting.load(Ordering::Acquire) == 0 {
            memory = Vec::new();
        }
        let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = job else {
            return; // the pool is gone
        };
        waiting.fetch_sub(1, Ordering::AcqRel);
        let Job {
            hash,
            password,
            reply,
            slot,
        } = job;
        if reply.is_closed() {
            continue; // nobody waits for this answer any more
        }
        let matched = hash.matches(&password, &mut memory);
        drop(slot);
        let _ = reply.send(matched);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn verifies_against_phc_strings() {
        let phc = crate::auth::hash_password("s3cret").unwrap();
        let hash = Arc::new(StoredHash::parse(&phc).unwrap());
        let pool = HashPool::start(1, 4).unwrap();
        assert!(pool.verify(hash.clone(), "s3cret").await.unwrap());
        assert!(!pool.verify(hash.clone(), "s3cret ").await.unwrap());
        assert!(!pool.verify(hash, "").await.unwrap());
    }

    #[tokio::test]
    async fn sheds_when_full() {
        let phc = crate::auth::hash_password("pw").unwrap();
        let hash = Arc::new(StoredHash::parse(&phc).unwrap());
        let pool = Arc::new(HashPool::start(1, 1).unwrap());
        let attempts: Vec<_> = (0..8)
            .map(|_| {
                let (pool, hash) = (pool.clone(), hash.clone());
                tokio::spawn(async move { pool.verify(hash, "wrong").await.is_err() })
            })
            .collect();
        let mut shed = 0;
        for a in attempts {
            shed += usize::from(a.await.unwrap());
        }
        assert!(shed >= 1, "nothing shed with 1 thread and a queue of 1");
        assert!(pool.verify(hash, "pw").await.unwrap());
    }

    #[test]
    fn rejects_what_it_cannot_verify() {
        assert!(matches!(
            StoredHash::parse("plain"),
            Err(HashError::NotPhc(_))
        ));
        assert!(matches!(
            StoredHash::parse("$pbkdf2-sha256$i=1000$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"),
            Err(HashError::NotArgon2(_))
        ));
    }
}
