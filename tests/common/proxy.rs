//! A loopback TCP relay in front of the real broker that can damage the record batches of Fetch
//! responses, as a failing disk or a bad network card would. Kafka frames every request and response
//! with a 4-byte length; a request names its API and correlation id, and the response repeats the
//! correlation id, so Fetch responses can be told apart without decoding anything else.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

const FETCH: i16 = 1;
/// Fetch responses shorter than this carry no records worth damaging.
const MIN_DAMAGED_RESPONSE: usize = 300;
/// The byte flipped by `Damage::Payload`, counted from the end of the response. A Fetch response of
/// one partition ends with three one-byte tag sections after the record batches, so this lands in
/// the last batch's records.
const FROM_END: usize = 10;
/// How a zstd frame starts (its magic number, little-endian).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// What happens to large Fetch responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Damage {
    None = 0,
    /// One byte of the last batch's records flipped: its CRC no longer matches.
    Payload = 1,
    /// The last zstd frame's magic number broken: it cannot be decompressed, whatever the CRC says.
    ZstdFrame = 2,
}

pub struct CorruptingProxy {
    damage: Arc<AtomicU8>,
    corrupted: Arc<AtomicU64>,
}

static PROXY: OnceLock<Mutex<CorruptingProxy>> = OnceLock::new();

/// The proxy in front of the real broker's `CORRUPTIBLE` listener, held by one test at a time (the
/// damage it does applies to every client that goes through it).
pub fn corrupting_proxy() -> MutexGuard<'static, CorruptingProxy> {
    let kafka = super::kafka::kafka();
    let proxy = PROXY.get_or_init(|| {
        Mutex::new(CorruptingProxy::start(
            &kafka.corruptible_proxy,
            &kafka.corruptible,
        ))
    });
    let guard = proxy
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    guard.damage_fetches(Damage::None);
    guard
}

impl CorruptingProxy {
    /// Listens on `listen` and relays every connection to `upstream`, for the rest of the process.
    fn start(listen: &str, upstream: &str) -> CorruptingProxy {
        let listener = TcpListener::bind(listen).expect("the proxy's port is free");
        let proxy = CorruptingProxy {
            damage: Arc::new(AtomicU8::new(Damage::None as u8)),
            corrupted: Arc::new(AtomicU64::new(0)),
        };
        let (damage, corrupted) = (proxy.damage.clone(), proxy.corrupted.clone());
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let fetches = Arc::new(Mutex::new(HashSet::new()));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let f2 = fetches.clone();
                std::thread::spawn(move || relay_requests(c2, s2, f2));
                let (damage, corrupted) = (damage.clone(), corrupted.clone());
                std::thread::spawn(move || {
                    relay_responses(server, client, fetches, &damage, &corrupted)
                });
            }
        });
        proxy
    }

    pub fn damage_fetches(&self, damage: Damage) {
        self.damage.store(damage as u8, Relaxed);
    }

    /// Responses damaged so far.
    pub fn corrupted(&self) -> u64 {
        self.corrupted.load(Relaxed)
    }
}

fn read_frame(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).ok()?;
    let mut frame = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    stream.read_exact(&mut frame).ok()?;
    Some(frame)
}

fn write_frame(stream: &mut TcpStream, frame: &[u8]) -> Option<()> {
    stream.write_all(&(frame.len() as i32).to_be_bytes()).ok()?;
    stream.write_all(frame).ok()
}

/// Client to broker: notes the correlation id of every Fetch request.
fn relay_requests(mut from: TcpStream, mut to: TcpStream, fetches: Arc<Mutex<HashSet<i32>>>) {
    while let Some(frame) = read_frame(&mut from) {
        if frame.len() >= 8 && i16::from_be_bytes([frame[0], frame[1]]) == FETCH {
            let id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            fetches.lock().unwrap().insert(id);
        }
        if write_frame(&mut to, &frame).is_none() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Broker to client: damages large Fetch responses as `damage` says.
fn relay_responses(
    mut from: TcpStream,
    mut to: TcpStream,
    fetches: Arc<Mutex<HashSet<i32>>>,
    damage: &AtomicU8,
    corrupted: &AtomicU64,
) {
    while let Some(mut frame) = read_frame(&mut from) {
        let id = (frame.len() >= 4)
            .then(|| i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]));
        let fetch = id.is_some_and(|id| fetches.lock().unwrap().remove(&id));
        if fetch && frame.len() >= MIN_DAMAGED_RESPONSE {
            let at = match damage.load(Relaxed) {
                x if x == Damage::Payload as u8 => Some(frame.len() - FROM_END),
                x if x == Damage::ZstdFrame as u8 => {
                    frame.windows(4).rposition(|w| w == ZSTD_MAGIC)
                }
                _ => None,
            };
            if let Some(at) = at {
                frame[at] ^= 0xff;
                corrupted.fetch_add(1, Relaxed);
            }
        }
        if write_frame(&mut to, &frame).is_none() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
