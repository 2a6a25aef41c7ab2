//! The event writer: every event of a run goes through one thread that numbers it and
//! appends it to `events.jsonl` through a buffer, flushed when an episode finishes (once the
//! writer has also written the lines queued behind the finish, or within [`MIN_IDLE`] when
//! the queue does not empty, so that a busy run's many finishes make one write, not one
//! each: a line in the queue is no safer than one in the buffer). Other consumers of the
//! stream (the progress display) subscribe to the same events.
//!
//! The queue to the writer holds at most [`QUEUE_BYTES`] of events: past that, whoever
//! emits waits until the writer has caught up, so that a slow disk slows the episodes
//! instead of growing the runner's memory.
//!
//! The writer never blocks on a busy queue: when it finds it empty it dozes for
//! [`MIN_IDLE`], so that an emitter of a busy run never pays for waking it, and its finishes
//! reach the file within about two dozes. Only an emitter over the cap and the log's close
//! wake it early. When the queue is still empty after the doze (the run waits for its
//! models), the writer writes out its buffer and sleeps until the next emitter wakes it: a
//! run that waits costs no CPU, and whoever follows the file sees every line. An emitter on
//! a runtime's worker leaves that wake to the moment its thread parks (see [`owed`]): the
//! writer then wakes once for all the events of a model's answer, and sleeps again without
//! a doze.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::event::{Event, SCHEMA_VERSION};
use super::timestamp::Timestamp;

/// The bytes of events that may wait for the writer before emitters wait too: a few
/// hundred milliseconds of a busy run's events.
pub const QUEUE_BYTES: usize = 4 << 20;

/// The writer's doze on an empty queue. Past it, the queue has been empty a while and the
/// writer sleeps until an emitter wakes it. Each doze ends in a wake-up of the thread, which a
/// run waiting for its models would pay for at every call; one is enough to tell a busy run
/// (events every few microseconds) from a waiting one.
const MIN_IDLE: Duration = Duration::from_millis(1);

/// How often a close wakes a sleeping writer while handles of the log are still to be
/// dropped.
const CLOSE_LOOK: Duration = Duration::from_millis(10);

/// How many bytes of written bodies are kept for emitters to serialise into, and the
/// largest body kept. A body freed by the writer thread goes back to the allocator's arena
/// of the thread that made it, under that arena's lock: with every event's body freed so,
/// the emitting threads and the writer took turns at those locks (a third of a busy run's
/// futex calls). A busy run has a few thousand bodies on their way at once; a count of 256
/// left most of them to be freed so.
const SPARE_BYTES: usize = 2 << 20;
const SPARE_BODY_BYTES: usize = 16 * 1024;
/// How many written bodies the writer gathers before giving them back (one lock for all).
const GIVE_BACK_EVERY: usize = 64;

/// A test hook, not a setting: microseconds the writer spends after each line, standing
/// in for a slow disk.
const WRITE_DELAY_VAR: &str = "RUNNER_LOG_WRITE_DELAY_US";

struct Line {
    episode_id: Option<Arc<str>>,
    ts: Timestamp,
    /// The event serialised by the emitter, so that serialisation runs on many cores.
    body: Vec<u8>,
    flush: bool,
}

/// A consumer of a run's events besides the file: it sees each event as it is emitted, on
/// the task that emits it, with its episode id (`None` for run-level events).
pub trait Subscriber: Send {
    fn event(&mut self, episode_id: Option<&str>, event: &Event);
}

/// A subscriber shared with whoever reads it after the run (the progress bar is cleared),
/// and the events it wants: the others never take its lock, so episodes running at once
/// do not queue on it for events it would ignore.
#[derive(Clone)]
pub struct Subscription {
    wants: fn(&Event) -> bool,
    subscriber: Arc<Mutex<dyn Subscriber>>,
}

impl Subscription {
    pub fn new(subscriber: Arc<Mutex<dyn Subscriber>>, wants: fn(&Event) -> bool) -> Self {
        Subscription { wants, subscriber }
    }

    /// Every event.
    pub fn all(subscriber: Arc<Mutex<dyn Subscriber>>) -> Self {
        Subscription { wants: |_| true, subscriber }
    }
}

/// A handle to the run's log; cheap to clone.
#[derive(Clone)]
pub struct EventLog {
    sender: Sender<Line>,
    backlog: Arc<Backlog>,
    subscribers: Arc<[Subscription]>,
    /// The writer thread, woken for what must not wait for its sleep.
    writer: std::thread::Thread,
}

/// The bytes queued for the writer, and where emitters wait for it to drain.
struct Backlog {
    bytes: AtomicUsize,
    cap: usize,
    /// The writer has stopped (done or failed): nobody waits for it any more.
    closed: AtomicBool,
    lock: Mutex<()>,
    drained: Condvar,
    /// The most bytes ever queued, and how many times an emitter waited.
    peak: AtomicUsize,
    waits: AtomicUsize,
    /// How many times the writer has looked at an empty queue (each doze ends in one).
    empty_looks: AtomicUsize,
    /// Bodies the writer has written, emptied for emitters to serialise into again.
    spare: Mutex<Spare>,
    /// The writer sleeps until an emitter wakes it: the queue stayed empty through its dozes.
    asleep: AtomicBool,
    /// The writer was woken by a thread about to park: what it queued is all there is for
    /// now, and the writer need not doze before it sleeps again.
    batch_done: AtomicBool,
}

impl Backlog {
    fn new(cap: usize) -> Self {
        Backlog {
            bytes: AtomicUsize::new(0),
            cap,
            closed: AtomicBool::new(false),
            lock: Mutex::new(()),
            drained: Condvar::new(),
            peak: AtomicUsize::new(0),
            waits: AtomicUsize::new(0),
            empty_looks: AtomicUsize::new(0),
            spare: Mutex::default(),
            asleep: AtomicBool::new(false),
            batch_done: AtomicBool::new(false),
        }
    }

    /// Whether the writer was asleep with the line just queued unseen: it is woken once,
    /// by the emitter that takes the flag. Paired with the writer's [`Backlog::fall_asleep`]:
    /// each side writes its own mark (the line, the flag) before it reads the other's.
    fn woken_from_sleep(&self) -> bool {
        fence(Ordering::SeqCst);
        self.asleep.load(Ordering::SeqCst) && self.asleep.swap(false, Ordering::SeqCst)
    }

    /// Marks the writer asleep; it looks at the queue once more before it sleeps.
    fn fall_asleep(&self) {
        self.asleep.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// An empty buffer for an event's body: one the writer is done with, or a new one.
    fn body(&self) -> Vec<u8> {
        let spare = {
            let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
            let body = spare.bodies.pop();
            spare.bytes -= body.as_ref().map_or(0, Vec::capacity);
            body
        };
        // Most events fit in 512 bytes: one allocation instead of a few growths.
        spare.unwrap_or_else(|| Vec::with_capacity(512))
    }

    /// Gives written bodies back for reuse, emptied, keeping at most [`SPARE_BYTES`] of
    /// them and none over [`SPARE_BODY_BYTES`].
    fn give_back(&self, bodies: &mut Vec<Vec<u8>>) {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        for mut body in bodies.drain(..) {
            let size = body.capacity();
            if size <= SPARE_BODY_BYTES && spare.bytes + size <= SPARE_BYTES {
                body.clear();
                spare.bytes += size;
                spare.bodies.push(body);
            }
        }
    }

    /// Counts `size` more bytes queued; returns whether the queue is over its cap.
    fn add(&self, size: usize) -> bool {
        let queued = self.bytes.fetch_add(size, Ordering::AcqRel) + size;
        self.peak.fetch_max(queued, Ordering::Relaxed);
        queued > self.cap
    }

    /// Waits until the queue has drained to half its cap (or the writer is gone): waking
    /// at every line the writer takes would cost a wake-up per event.
    fn wait_for_room(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let mut guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        while self.bytes.load(Ordering::Acquire) > self.cap / 2 && !self.closed.load(Ordering::Acquire) {
            guard = self.drained.wait(guard).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The writer took `size` bytes off the queue.
    fn remove(&self, size: usize) {
        let before = self.bytes.fetch_sub(size, Ordering::AcqRel);
        if before > self.cap / 2 && before - size <= self.cap / 2 {
            self.wake_all();
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake_all();
    }

    fn wake_all(&self) {
        // Taking the lock orders this after a waiter's check of the count.
        drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
        self.drained.notify_all();
    }
}

/// Written bodies waiting to be reused, and the bytes they hold.
#[derive(Default)]
struct Spare {
    bodies: Vec<Vec<u8>>,
    bytes: usize,
}

/// The writer's side of the backlog: closes it however the writer ends, so that no
/// emitter waits for a writer that is gone.
struct Closing(Arc<Backlog>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// How the writer is run: its queue's cap, and the slow-disk test hook.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriterSettings {
    pub queue_bytes: usize,
    pub delay_per_line: Option<Duration>,
}

impl WriterSettings {
    fn from_env() -> Self {
        let delay = std::env::var(WRITE_DELAY_VAR).ok().and_then(|v| v.trim().parse::<u64>().ok());
        WriterSettings { queue_bytes: QUEUE_BYTES, delay_per_line: delay.map(Duration::from_micros) }
    }
}

/// Owns the writer thread; `close` waits for every event to reach the disk.
pub struct LogWriter {
    thread: JoinHandle<std::io::Result<()>>,
    /// Says when every event is written to the file (not yet synced to the disk).
    written: Receiver<()>,
}

/// The log's last writes on their way to the disk (`sync_data`, a disk's round trip): what
/// is written may be read meanwhile. [`Syncing::wait`] says whether they got there; dropped,
/// it still waits for them.
pub struct Syncing {
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Syncing {
    pub fn wait(mut self) -> std::io::Result<()> {
        match self.thread.take().map(JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(std::io::Error::other("the event writer panicked")),
        }
    }
}

impl Drop for Syncing {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl EventLog {
    /// Creates `path` and starts the writer.
    pub fn create(path: &Path, run_id: &str) -> std::io::Result<(EventLog, LogWriter)> {
        Self::append(path, run_id, 0)
    }

    /// Appends to an existing log whose last event has number `last_seq`.
    pub fn append(path: &Path, run_id: &str, last_seq: u64) -> std::io::Result<(EventLog, LogWriter)> {
        Self::append_with(path, run_id, last_seq, WriterSettings::from_env())
    }

    pub(crate) fn append_with(
        path: &Path,
        run_id: &str,
        last_seq: u64,
        settings: WriterSettings,
    ) -> std::io::Result<(EventLog, LogWriter)> {
        drop_torn_tail(path)?;
        let file = File::options().create(true).append(true).open(path)?;
        let (sender, receiver) = channel();
        let (all_written, written) = channel();
        let run_id = serde_json::to_string(run_id)?;
        let backlog = Arc::new(Backlog::new(settings.queue_bytes));
        let closing = Closing(backlog.clone());
        let out = BufWriter::with_capacity(256 * 1024, file);
        let thread = std::thread::Builder::new().name("event-log".into()).spawn(move || {
            write_lines(receiver, out, &run_id, last_seq, &closing.0, settings.delay_per_line, all_written)
        })?;
        let writer = thread.thread().clone();
        Ok((EventLog { sender, backlog, subscribers: Arc::new([]), writer }, LogWriter { thread, written }))
    }

    /// The same log, with `subscribers` seeing every event emitted through it from now on.
    pub fn with_subscribers(self, subscribers: &[Subscription]) -> EventLog {
        let all: Vec<Subscription> = self.subscribers.iter().chain(subscribers).cloned().collect();
        EventLog { subscribers: all.into(), ..self }
    }

    /// Appends an event. `episode_id` is `None` for run-level events.
    pub fn emit(&self, episode_id: Option<&Arc<str>>, event: &Event) {
        self.emit_sized(episode_id, event);
    }

    /// Appends an event; the bytes of its body.
    fn emit_sized(&self, episode_id: Option<&Arc<str>>, event: &Event) -> usize {
        let flush =
            matches!(event, Event::EpisodeFinished { .. } | Event::RunFinished { .. } | Event::RunStarted { .. });
        let mut body = self.backlog.body();
        if let Err(e) = serde_json::to_writer(&mut body, event) {
            // Our own event types always serialise; a failure here is a bug in runner.
            panic!("failed to serialise an event: {e}");
        }
        let ts = Timestamp::now();
        // The writer outlives every handle; if it died, its error surfaces at `close`.
        let size = body.len();
        self.queue(Line { episode_id: episode_id.cloned(), ts, body, flush });
        for s in self.subscribers.iter().filter(|s| (s.wants)(event)) {
            // A subscriber that panicked has shown what it could; the run goes on.
            s.subscriber.lock().unwrap_or_else(PoisonError::into_inner).event(episode_id.map(|id| &**id), event);
        }
        size
    }

    /// Appends a line of another log under this one's header: `body` is the event's
    /// fields (`{"type":…}`), `ts` the time it was stamped with there (`None`: now). Subscribers do not
    /// see it: it is a record of what happened before, not an event of this run.
    pub fn emit_copied(&self, episode_id: &Arc<str>, ts: Option<&str>, mut body: Vec<u8>) {
        let ts = ts.and_then(Timestamp::of_text).unwrap_or_else(Timestamp::now);
        let mut buffer = self.backlog.body();
        buffer.append(&mut body);
        self.queue(Line { episode_id: Some(episode_id.clone()), ts, body: buffer, flush: false });
    }

    /// Hands a line to the writer, waiting for room when the queue is over its cap.
    fn queue(&self, line: Line) {
        let queued = line.queued_bytes();
        let over = self.backlog.add(queued);
        if self.sender.send(line).is_err() {
            self.backlog.remove(queued);
        } else if over {
            self.writer.unpark();
            self.backlog.wait_for_room();
        } else if self.backlog.woken_from_sleep() {
            // A writer that dozes looks again within MIN_IDLE: a busy run's lines wake nobody.
            // A sleeping one is woken once this thread's work is done, when it can.
            if !owed::defer(&self.backlog, &self.writer) {
                self.writer.unpark();
            }
        } else {
            owed::count_line();
        }
    }

    /// A handle that stamps every event with one episode's id.
    pub fn recorder(&self, episode_id: &str) -> Recorder {
        Recorder { log: self.clone(), episode_id: Arc::from(episode_id), written: Arc::default() }
    }
}

/// What a runtime's worker thread runs before it parks: the wakes of sleeping writers its
/// emitters owe are paid, all lines of its work so far written in one go. From its first
/// park on, the thread's emitters owe their wakes instead of waking a writer at once.
pub fn on_worker_park() {
    owed::pay(true);
}

/// Wakes of sleeping writers deferred to the moment the emitting thread parks: a run that
/// waits for its models then wakes its writer once per wait (after the events of a model's
/// answer, the tool calls and observations that follow), not once per event nor twice per
/// wait. Only a thread known to park (a runtime's worker, marked at its first park) defers;
/// any other wakes the writer at once. A thread that goes on working without parking pays
/// what it owes after [`OWED_LINES`] more lines.
mod owed {
    use std::cell::RefCell;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::thread::Thread;

    use super::Backlog;

    /// The most lines a thread queues while owing a wake before it pays it.
    pub(super) const OWED_LINES: u32 = 64;

    #[derive(Default)]
    struct Owed {
        /// The thread parks (a worker of the runtime): its wakes may wait for that.
        parks: bool,
        writers: Vec<(Arc<Backlog>, Thread)>,
        lines: u32,
    }

    thread_local! {
        static OWED: RefCell<Owed> = RefCell::default();
    }

    /// Owes `writer` a wake when this thread parks; `false` when it does not park (the
    /// caller wakes the writer itself).
    pub(super) fn defer(backlog: &Arc<Backlog>, writer: &Thread) -> bool {
        OWED.try_with(|owed| {
            let mut owed = owed.borrow_mut();
            if !owed.parks {
                return false;
            }
            if !owed.writers.iter().any(|(b, _)| Arc::ptr_eq(b, backlog)) {
                owed.writers.push((backlog.clone(), writer.clone()));
            }
            true
        })
        .unwrap_or(false)
    }

    /// Counts a line queued by this thread; pays its wakes once it owes them for too long.
    pub(super) fn count_line() {
        let due = OWED
            .try_with(|owed| {
                let mut owed = owed.borrow_mut();
                if owed.writers.is_empty() {
                    return false;
                }
                owed.lines += 1;
                owed.lines >= OWED_LINES
            })
            .unwrap_or(false);
        if due {
            pay(false);
        }
    }

    /// Wakes the writers this thread owes; `parking` marks it as a thread that parks, whose
    /// work is done for now: a writer it wakes writes what it finds and sleeps again at once.
    pub(super) fn pay(parking: bool) {
        let _ = OWED.try_with(|owed| {
            let mut owed = owed.borrow_mut();
            owed.parks |= parking;
            owed.lines = 0;
            for (backlog, writer) in owed.writers.drain(..) {
                if parking {
                    backlog.batch_done.store(true, Ordering::Release);
                }
                writer.unpark();
            }
        });
    }
}

impl LogWriter {
    /// Waits until every handle is dropped and all events are on disk.
    pub fn close(self) -> std::io::Result<()> {
        self.close_written()?.wait()
    }

    /// Waits until every handle is dropped and all events are written to the file; the
    /// handle it gives waits for them to reach the disk.
    pub fn close_written(self) -> std::io::Result<Syncing> {
        let writer = self.thread.thread().clone();
        let syncing = Syncing { thread: Some(self.thread) };
        loop {
            // The writer may be asleep on an empty queue: it ends as soon as it looks again
            // after the last handle is gone, which may be dropped after this call began, so
            // it is woken again until it has ended.
            writer.unpark();
            match self.written.recv_timeout(CLOSE_LOOK) {
                Ok(()) => return Ok(syncing),
                Err(RecvTimeoutError::Timeout) => continue,
                // The writer ended before it had written everything: its result says why.
                Err(RecvTimeoutError::Disconnected) => return syncing.wait().map(|()| Syncing { thread: None }),
            }
        }
    }
}

/// Cuts an unfinished last line (a crash mid-write), so that what is appended starts on a
/// line of its own instead of turning the torn line into a bad one mid-file.
pub(crate) fn drop_torn_tail(path: &Path) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match File::options().read(true).write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let len = file.seek(SeekFrom::End(0))?;
    let mut at = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while at > 0 {
        let start = at.saturating_sub(chunk.len() as u64);
        let n = (at - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk[..n])?;
        if let Some(i) = chunk[..n].iter().rposition(|b| *b == b'\n') {
            let keep = start + i as u64 + 1;
            if keep < len {
                file.set_len(keep)?;
            }
            return Ok(());
        }
        at = start;
    }
    file.set_len(0)
}

impl Line {
    /// What the line holds in memory while it waits, as the backlog counts it.
    fn queued_bytes(&self) -> usize {
        std::mem::size_of::<Line>() + self.body.len()
    }
}

fn write_lines(
    receiver: Receiver<Line>,
    mut out: BufWriter<File>,
    run_id: &str,
    last_seq: u64,
    backlog: &Backlog,
    delay: Option<Duration>,
    // Told when every line is written, before they are synced.
    written: Sender<()>,
) -> std::io::Result<()> {
    let mut seq = last_seq;
    let mut owed = Duration::ZERO;
    // The queue was found empty once already (and the writer dozed): the next time it sleeps.
    let mut dozed = false;
    let mut asleep = false;
    // When a line that asked for a flush was written and not flushed yet: it is, once the
    // lines queued behind it are written too (one write for a busy run's many finishes), or
    // once it has waited MIN_IDLE (a queue that never empties, a slow disk).
    let mut unflushed: Option<Instant> = None;
    let mut written_bodies = Vec::with_capacity(GIVE_BACK_EVERY);
    loop {
        let line = match receiver.try_recv() {
            Ok(line) => line,
            Err(TryRecvError::Empty) if unflushed.is_some() => {
                out.flush()?;
                unflushed = None;
                continue;
            }
            Err(TryRecvError::Empty) => {
                backlog.empty_looks.fetch_add(1, Ordering::Relaxed);
                backlog.give_back(&mut written_bodies);
                if asleep {
                    // Until the next line's emitter, or the close (a spurious wake-up looks
                    // at the queue and sleeps again).
                    std::thread::park();
                } else if dozed || backlog.batch_done.swap(false, Ordering::AcqRel) {
                    // What is written so far reaches the file before the wait, for whoever
                    // follows the log while it is written.
                    out.flush()?;
                    // The queue is looked at once more after the mark: a line queued before
                    // the emitter could see it is found there, one queued after wakes us.
                    backlog.fall_asleep();
                    asleep = true;
                } else {
                    // Woken early by an emitter over the cap, or the close.
                    std::thread::park_timeout(MIN_IDLE);
                    dozed = true;
                }
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if asleep {
            // Taken back unless the line's emitter already took it (and woke us).
            backlog.asleep.store(false, Ordering::SeqCst);
            asleep = false;
        }
        dozed = false;
        seq += 1;
        write_line(&mut out, run_id, seq, line.ts.as_str(), line.episode_id.as_deref(), &line.body)?;
        match unflushed {
            Some(since) if since.elapsed() >= MIN_IDLE => {
                out.flush()?;
                unflushed = None;
            }
            None if line.flush => unflushed = Some(Instant::now()),
            _ => {}
        }
        if let Some(delay) = delay {
            // Slept in whole milliseconds, so that a delay of a few microseconds per line
            // is kept to rather than rounded up to the timer's slack.
            owed += delay;
            if owed >= Duration::from_millis(1) {
                std::thread::sleep(std::mem::take(&mut owed));
            }
        }
        backlog.remove(line.queued_bytes());
        written_bodies.push(line.body);
        if written_bodies.len() == GIVE_BACK_EVERY {
            backlog.give_back(&mut written_bodies);
        }
    }
    out.flush()?;
    // Whoever closed the log may read it now (no one may be waiting: that is no fault).
    let _ = written.send(());
    out.get_ref().sync_data()
}

/// A run-level event written straight to `out` with number `seq`, laid out as the writer
/// thread lays it out: for logs written in one go (a run's first line, a merge).
pub fn write_event(out: &mut impl Write, run_id: &str, seq: u64, event: &Event) -> std::io::Result<()> {
    let quoted_id = serde_json::to_string(run_id)?;
    write_line(out, &quoted_id, seq, Timestamp::now().as_str(), None, &serde_json::to_vec(event)?)
}

/// One line of the log: the header (`v`, `run_id` — already JSON-quoted —, `seq`, `ts`,
/// `episode_id`), then the fields of `body`, a serialised event. Readers find `type` and
/// `episode_id` by this layout without parsing the line.
pub(crate) fn write_line(
    out: &mut impl Write,
    run_id: &str,
    seq: u64,
    ts: &str,
    episode_id: Option<&str>,
    body: &[u8],
) -> std::io::Result<()> {
    // Pieces, not `write!`: every event of a run goes through here.
    out.write_all(b"{\"v\":")?;
    write_decimal(out, u64::from(SCHEMA_VERSION))?;
    out.write_all(b",\"run_id\":")?;
    out.write_all(run_id.as_bytes())?;
    out.write_all(b",\"seq\":")?;
    write_decimal(out, seq)?;
    out.write_all(b",\"ts\":\"")?;
    out.write_all(ts.as_bytes())?;
    out.write_all(b"\"")?;
    if let Some(id) = episode_id {
        out.write_all(b",\"episode_id\":")?;
        serde_json::to_writer(&mut *out, id)?;
    }
    // The body is a JSON object: splice its fields after the header's. No secret is
    // stored, whichever way it came into an event.
    out.write_all(b",")?;
    out.write_all(&super::secrets::scrub_bytes(body.get(1..).unwrap_or_default()))?;
    out.write_all(b"\n")
}

fn write_decimal(out: &mut impl Write, mut value: u64) -> std::io::Result<()> {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.write_all(&digits[start..])
}

/// One episode's view of the log.
#[derive(Clone)]
pub struct Recorder {
    log: EventLog,
    episode_id: Arc<str>,
    /// Bytes this episode has written to the log.
    written: Arc<AtomicUsize>,
}

/// The bytes of log an episode may write (every event of it counts) before the payloads of
/// its events are cut to [`OVER_BUDGET_PAYLOAD_BYTES`] (see [`Event::with_payloads_cut`]).
pub const EPISODE_LOG_BUDGET_BYTES: usize = 8 << 20;
/// What each payload of an event keeps (an observation's result, an inner call's arguments,
/// an `agent_log`'s message, …), past the episode's log budget.
pub const OVER_BUDGET_PAYLOAD_BYTES: usize = 128;

impl Recorder {
    pub fn emit(&self, event: &Event) {
        let over = self.written.load(Ordering::Relaxed) > EPISODE_LOG_BUDGET_BYTES;
        let cut = if over { event.with_payloads_cut(OVER_BUDGET_PAYLOAD_BYTES) } else { None };
        let size = self.log.emit_sized(Some(&self.episode_id), cut.as_ref().unwrap_or(event));
        self.written.fetch_add(size, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[derive(Default)]
    struct Seen(Vec<(Option<String>, Event)>);

    impl Subscriber for Seen {
        fn event(&mut self, episode_id: Option<&str>, event: &Event) {
            self.0.push((episode_id.map(str::to_owned), event.clone()));
        }
    }

    #[test]
    fn a_subscriber_sees_each_event_with_its_episode_as_the_file_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        let unseen = Event::Final { step: 0, call_id: "c0".into(), answer: "before".into() };
        log.emit(None, &unseen);
        let log = log.with_subscribers(&[Subscription::all(seen.clone())]);
        let fin = Event::Final { step: 1, call_id: "c".into(), answer: "42".into() };
        log.recorder("e1").emit(&fin);
        drop(log);
        writer.close().unwrap();
        let seen = &seen.lock().unwrap().0;
        assert_eq!(*seen, [(Some("e1".to_string()), fin)], "only what was emitted after subscribing");
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2, "the file has both");
    }

    #[test]
    fn a_subscriber_is_given_only_the_events_it_wants() {
        let dir = tempfile::tempdir().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
        let log = log.with_subscribers(&[Subscription::new(seen.clone(), |e| matches!(e, Event::Final { .. }))]);
        let fin = Event::Final { step: 1, call_id: "c".into(), answer: "42".into() };
        log.emit(None, &Event::Error { step: 1, cause: "x".into(), message: "m".into() });
        log.emit(None, &fin);
        drop(log);
        writer.close().unwrap();
        assert_eq!(seen.lock().unwrap().0, [(None, fin)]);
    }

    /// Bodies are reused once written: a short event after a long one in the same buffer
    /// is written whole and alone.
    #[test]
    fn a_reused_body_holds_only_its_own_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        let answer = |step: u32| if step.is_multiple_of(2) { "x".repeat(3000) } else { step.to_string() };
        for step in 0..400 {
            log.emit(None, &Event::Final { step, call_id: "c".into(), answer: answer(step) });
            if step.is_multiple_of(50) {
                // The writer empties the queue and gives its bodies back.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Once the queue is empty the writer gives back what it holds (the last emits may
        // have taken every body given back before them).
        let reused = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(5));
            !log.backlog.spare.lock().unwrap().bodies.is_empty()
        });
        drop(log);
        writer.close().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let answers: Vec<(u64, String)> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["step"].as_u64().unwrap(), v["answer"].as_str().unwrap().to_owned()))
            .collect();
        let expected: Vec<(u64, String)> = (0..400).map(|s| (u64::from(s), answer(s))).collect();
        assert_eq!(answers, expected);
        assert!(reused, "no body was given back for reuse");
    }

    #[test]
    fn a_body_too_large_to_keep_is_not_kept() {
        let backlog = Backlog::new(QUEUE_BYTES);
        let mut bodies = vec![b"kept".to_vec(), Vec::with_capacity(SPARE_BODY_BYTES + 1)];
        backlog.give_back(&mut bodies);
        let spare = backlog.spare.lock().unwrap();
        assert_eq!(spare.bodies.len(), 1);
        assert!(spare.bodies[0].is_empty() && spare.bodies[0].capacity() >= 4, "kept, emptied");
        assert_eq!(spare.bytes, spare.bodies[0].capacity());
        drop(spare);
        // Past the bytes kept, a body is let go.
        let mut many: Vec<Vec<u8>> =
            (0..SPARE_BYTES / SPARE_BODY_BYTES + 1).map(|_| Vec::with_capacity(SPARE_BODY_BYTES)).collect();
        backlog.give_back(&mut many);
        let spare = backlog.spare.lock().unwrap();
        assert!(spare.bytes <= SPARE_BYTES, "{} bytes kept", spare.bytes);
        assert_eq!(spare.bytes, spare.bodies.iter().map(Vec::capacity).sum::<usize>());
    }

    #[test]
    fn a_log_closed_for_reading_has_every_line_in_its_file_before_the_sync_is_awaited() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        // Slowed, so that lines are still queued when the log is closed.
        let settings = WriterSettings { queue_bytes: QUEUE_BYTES, delay_per_line: Some(Duration::from_micros(200)) };
        let (log, writer) = EventLog::append_with(&path, "r", 0, settings).unwrap();
        for step in 0..50 {
            log.emit(None, &Event::Final { step, call_id: "c".into(), answer: "42".into() });
        }
        drop(log);
        let syncing = writer.close_written().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 50);
        syncing.wait().unwrap();
    }

    /// An event that asks for a flush.
    fn run_finished() -> Event {
        Event::RunFinished {
            episodes: 1,
            scored: 1,
            passed: 1,
            unscored: 0,
            cancelled: 0,
            interrupted: false,
            wall_ms: 1.0,
        }
    }

    /// Polls `path` until it holds `n` lines; false after 5 s.
    fn lines_reach(path: &Path, n: usize) -> bool {
        (0..1000).any(|_| {
            let seen = std::fs::read_to_string(path).unwrap_or_default().lines().count();
            seen == n || {
                std::thread::sleep(Duration::from_millis(5));
                false
            }
        })
    }

    /// Polls until the writer sleeps without a timeout; false after 5 s.
    fn falls_asleep(log: &EventLog) -> bool {
        (0..1000).any(|_| {
            log.backlog.asleep.load(Ordering::SeqCst) || {
                std::thread::sleep(Duration::from_millis(5));
                false
            }
        })
    }

    /// A run that waits for its models leaves its writer asleep: no wake-up on a timer.
    #[test]
    fn a_waiting_writer_sleeps_until_a_line_comes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        log.emit(None, &run_finished());
        assert!(lines_reach(&path, 1), "the finish is not in the file");
        assert!(falls_asleep(&log), "the writer still dozes on a timer");
        let looks = log.backlog.empty_looks.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        let later = log.backlog.empty_looks.load(Ordering::Relaxed);
        // A writer dozing on a timer would look at every doze; a spurious wake-up may look once.
        assert!(later - looks <= 1, "the writer looked at its empty queue {} times in 300 ms", later - looks);
        // What it wrote before it slept is in the file, though nothing asked for a flush.
        log.emit(None, &Event::Final { step: 1, call_id: "c".into(), answer: "42".into() });
        assert!(falls_asleep(&log), "the line woke the writer, which then slept again");
        assert!(lines_reach(&path, 2), "a line that asked for no flush stayed in the buffer");
        drop(log);
        writer.close().unwrap();
    }

    /// A runtime whose workers pay their owed wakes when they park, as the command line's.
    fn parking_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .on_thread_park(super::on_worker_park)
            .build()
            .unwrap()
    }

    /// An episode's events emitted on a runtime's worker, then a wait (for a model): the
    /// sleeping writer is woken once, when the worker parks, for all of them; and it sleeps
    /// again without dozing (no look at the empty queue on a timer).
    #[test]
    fn a_workers_events_wake_a_sleeping_writer_once_when_it_parks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        log.emit(None, &run_finished());
        assert!(falls_asleep(&log));
        let runtime = parking_runtime();
        // The worker's first park marks it as a thread that parks.
        runtime.block_on(async { tokio::spawn(async {}).await.unwrap() });
        std::thread::sleep(Duration::from_millis(20));
        let looks = log.backlog.empty_looks.load(Ordering::Relaxed);
        let emitting = log.clone();
        let queued_unwritten = runtime.block_on(async move {
            tokio::spawn(async move {
                for step in 0..5 {
                    emitting.emit(None, &Event::Final { step, call_id: "c".into(), answer: "42".into() });
                }
                // The writer sleeps on: the wake is owed until this thread parks.
                std::thread::sleep(Duration::from_millis(50));
                std::fs::read_to_string(&path).unwrap().lines().count() == 1
            })
            .await
            .unwrap()
        });
        assert!(queued_unwritten, "the writer was woken before the worker parked");
        assert!(lines_reach(&dir.path().join("events.jsonl"), 6), "the worker's lines stayed queued after it parked");
        assert!(falls_asleep(&log));
        let later = log.backlog.empty_looks.load(Ordering::Relaxed);
        // Woken once: it looks at the empty queue when it has written the five lines, and
        // once more as it falls asleep; a doze would add a third.
        assert!(later - looks <= 2, "the writer looked at its empty queue {} times", later - looks);
        drop(log);
        writer.close().unwrap();
    }

    /// A worker that goes on working without parking pays its owed wake after a few dozen
    /// lines: its lines do not wait for the queue's cap.
    #[test]
    fn a_worker_that_never_parks_wakes_the_writer_after_a_few_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        log.emit(None, &run_finished());
        assert!(falls_asleep(&log));
        let runtime = parking_runtime();
        runtime.block_on(async { tokio::spawn(async {}).await.unwrap() });
        let emitting = log.clone();
        let path_seen = path.clone();
        let reached = runtime.block_on(async move {
            tokio::spawn(async move {
                for step in 0..super::owed::OWED_LINES + 1 {
                    emitting.emit(None, &Event::Final { step, call_id: "c".into(), answer: "42".into() });
                }
                // Still on the worker, which has not parked since.
                lines_reach(&path_seen, super::owed::OWED_LINES as usize + 2)
            })
            .await
            .unwrap()
        });
        assert!(reached, "the lines waited for the worker to park");
        drop(log);
        writer.close().unwrap();
    }

    /// A close that begins while a handle of the log is still held ends once it is dropped,
    /// though the writer is asleep by then.
    #[test]
    fn a_close_begun_before_the_last_handle_is_dropped_ends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        log.emit(None, &run_finished());
        assert!(falls_asleep(&log));
        let held = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(log);
        });
        let (done, closed) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(writer.close()));
        let result = closed.recv_timeout(Duration::from_secs(10));
        held.join().unwrap();
        assert!(matches!(result, Ok(Ok(()))), "the close never ended: {result:?}");
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
    }

    /// A line that comes just as the writer falls asleep wakes it: 300 finishes, each
    /// emitted after a pause around the writer's dozes, each reaches the file while the
    /// log is open (a lost wake-up would leave one in the queue until the close).
    #[test]
    fn no_line_is_left_queued_behind_a_sleeping_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        for n in 1..=300usize {
            std::thread::sleep(Duration::from_micros(fastrand::u64(0..5000)));
            log.emit(None, &run_finished());
            assert!(lines_reach(&path, n), "finish {n} stayed queued");
        }
        drop(log);
        writer.close().unwrap();
    }

    #[test]
    fn a_finish_reaches_the_file_with_what_was_queued_before_it_while_the_log_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        for step in 0..20 {
            log.emit(None, &Event::Final { step, call_id: "c".into(), answer: "42".into() });
        }
        log.emit(None, &run_finished());
        // Nothing else comes: the buffer is written out without the log's close.
        let lines = (0..500)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(10));
                std::fs::read_to_string(&path).unwrap().lines().count()
            })
            .find(|n| *n == 21);
        assert_eq!(lines, Some(21), "the finish and the lines before it are in the file");
        drop(log);
        writer.close().unwrap();
    }

    #[test]
    fn a_finish_reaches_the_file_even_when_the_queue_behind_it_never_empties() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        // 2 ms a line: the 256 KiB buffer would take seconds to fill and write itself out. A
        // small queue, so that what is left of it at the close is written quickly.
        let settings = WriterSettings { queue_bytes: 16 * 1024, delay_per_line: Some(Duration::from_millis(2)) };
        let (log, writer) = EventLog::append_with(&path, "r", 0, settings).unwrap();
        log.emit(None, &run_finished());
        let stop = Arc::new(AtomicBool::new(false));
        let busy = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut step = 0;
                while !stop.load(Ordering::Relaxed) {
                    log.emit(None, &Event::Final { step, call_id: "c".into(), answer: "42".into() });
                    step += 1;
                }
            })
        };
        let seen = (0..150).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::fs::read_to_string(&path).unwrap().contains("\"run_finished\"")
        });
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        drop(log);
        writer.close().unwrap();
        assert!(seen, "the finish stayed in the buffer while lines kept coming");
    }

    /// Regression: the queue to the writer had no bound, so a writer that fell behind (a
    /// slow disk) let the run's memory grow with every event emitted meanwhile.
    #[test]
    fn a_slow_writer_makes_emitters_wait_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let cap = 16 * 1024;
        let settings = WriterSettings { queue_bytes: cap, delay_per_line: Some(Duration::from_micros(100)) };
        let (log, writer) = EventLog::append_with(&path, "r", 0, settings).unwrap();
        let (threads, steps) = (4, 500u32);
        let event = |step: u32| Event::Final { step, call_id: format!("c{step}"), answer: "x".repeat(100) };
        let emitters: Vec<_> = (0..threads)
            .map(|t| {
                let recorder = log.recorder(&format!("e{t}"));
                std::thread::spawn(move || (0..steps).for_each(|step| recorder.emit(&event(step))))
            })
            .collect();
        emitters.into_iter().for_each(|t| t.join().unwrap());
        let backlog = log.backlog.clone();
        drop(log);
        writer.close().unwrap();

        let largest = std::mem::size_of::<Line>() + serde_json::to_vec(&event(steps)).unwrap().len() + 40;
        let peak = backlog.peak.load(Ordering::Relaxed);
        assert!(peak <= cap + threads * largest, "{peak} bytes were queued, past {cap} and one line per emitter");
        assert!(backlog.waits.load(Ordering::Relaxed) > 0, "no emitter waited for the slow writer");
        let lines: Vec<Value> =
            std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), threads * steps as usize, "every event is written");
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(line["seq"], i as u64 + 1, "numbered in order");
        }
        for t in 0..threads {
            let id = format!("e{t}");
            let order: Vec<u64> =
                lines.iter().filter(|l| l["episode_id"] == id).filter_map(|l| l["step"].as_u64()).collect();
            assert_eq!(order, (0..u64::from(steps)).collect::<Vec<_>>(), "{id}'s events in the order emitted");
        }
    }

    #[test]
    fn past_its_budget_an_episode_logs_payloads_cut_and_other_episodes_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        let big = crate::contract::Observation::of_result("c", serde_json::json!({"text": "x".repeat(1 << 20)}));
        let loud = log.recorder("loud");
        for step in 0..20 {
            loud.emit(&Event::Observation { step, observation: big.clone() });
        }
        log.recorder("quiet").emit(&Event::Observation { step: 0, observation: big.clone() });
        drop((log, loud));
        writer.close().unwrap();
        let lines: Vec<String> = std::fs::read_to_string(&path).unwrap().lines().map(str::to_owned).collect();
        let whole = lines.iter().filter(|l| l.len() > 1 << 20).count();
        // Eight whole ones take the loud episode past 8 MiB; the quiet episode's is whole.
        assert_eq!(whole, 9, "{:?}", lines.iter().map(String::len).collect::<Vec<_>>());
        let cut = &lines[8];
        assert!(cut.len() < 1000 && cut.contains("[... cut: showing"), "{cut}");
    }

    #[test]
    fn past_its_budget_an_episodes_free_text_is_cut_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let (log, writer) = EventLog::create(&path, "r").unwrap();
        let loud = log.recorder("loud");
        loud.emit(&Event::Final { step: 1, call_id: "c".into(), answer: "x".repeat(EPISODE_LOG_BUDGET_BYTES) });
        let long = "y".repeat(10_000);
        let error = crate::contract::ToolError::new(crate::contract::ErrorType::ExecutionError, long.clone());
        let failed = crate::contract::Observation::of_error("c", error);
        let refused =
            Event::GatewayRefused { status: 404, path: long.clone(), field: Some(long.clone()), message: long.clone() };
        for event in [
            Event::AgentLog { step: 1, message: long.clone() },
            refused,
            Event::Observation { step: 1, observation: failed },
        ] {
            loud.emit(&event);
        }
        drop((log, loud));
        writer.close().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        for line in &lines[1..] {
            assert!(line.len() < 1500 && line.contains("[... cut: showing"), "{} bytes: {}", line.len(), &line[..200]);
        }
    }
}
