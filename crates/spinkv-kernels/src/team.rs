//! The thread team a forward pass runs its fork-joins on.
//!
//! A decode step is ~150 fork-joins of 10–100 µs each. rayon parks an idle thread within
//! microseconds, so every fork-join waited 20–40 µs for a sleeping thread to wake (measured on
//! a 2-core AMD EPYC Zen 4: ~5–11 % of a decode step). A team's threads instead spin for a
//! while after their last task, watching for the next fork-join, and only then sleep.
//!
//! One rule keeps it free of the deadlock that sank keeping rayon's threads awake: a thread
//! waiting here never runs anything but tasks of the fork-join it waits for. Tasks are handed
//! out by one atomic counter, and the caller claims them too, so a fork-join never waits for a
//! thread that has not started one of its tasks: a worker that sleeps through it or was
//! descheduled costs speed, never progress. A task that starts a fork-join of its own runs it
//! serially in place, and callers on several threads take turns.
//!
//! [`Team::install`] makes a team current on the calling thread for a closure; the free
//! functions ([`for_each`], [`for_each_mut`], [`current_threads`]) use the current team, or
//! run in place when there is none (a wasm32 build, a worker thread, a nested fork-join).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker watches for the next fork-join before it sleeps. Long enough to span the
/// gaps inside a forward pass and between decode steps (sampling, streaming: ~0.1 ms), short
/// enough that an idle session does not burn its cores.
const WORKER_SPIN: Duration = Duration::from_millis(2);

/// Spins between clock reads while a worker watches (a clock read is ~20 ns, a spin ~10–40).
const SPINS_PER_CLOCK_READ: u32 = 64;

/// Spins a caller makes waiting for the last claimed tasks before it yields its core instead
/// (a task is 1–100 µs; a thread that yields lets a task on the same core finish when the team
/// has more threads than cores).
const CALLER_SPINS: u32 = 4096;

/// Tasks one fork-join may have (the counter keeps the task index in 32 bits, and the
/// largest index marks a fork-join closed).
pub const MAX_TASKS: usize = CLOSED as usize;

/// The counter's task index while a caller sets up the next fork-join: above every task count.
const CLOSED: u64 = u32::MAX as u64;

type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// What the team's threads share.
struct Shared {
    /// `generation << 32 | next task index` of the current fork-join: one compare-exchange
    /// claims a task and proves its fork-join is still the current one.
    counter: AtomicU64,
    /// Task count of the current fork-join.
    tasks: AtomicUsize,
    /// Points at the current fork-join's `Task` (on its caller's stack).
    task: AtomicPtr<()>,
    /// Tasks of the current fork-join that have finished.
    done: AtomicUsize,
    /// The first panic of the current fork-join, raised again on its caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Held by a caller for its whole fork-join: callers take turns.
    turn: Mutex<()>,
    /// Sleeping workers wait on `wake` under `sleep`.
    sleep: Mutex<()>,
    wake: Condvar,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    /// Whether workers spin before sleeping (not when the team outnumbers the cores).
    spin: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic is caught before it can poison these locks; a poisoned one still guards nothing
    // that a panic could leave half-written.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn generation(counter: u64) -> u32 {
    (counter >> 32) as u32
}

impl Shared {
    /// Claims and runs tasks of fork-join `gen` until none is left.
    fn work(&self, gen: u32) {
        loop {
            let seen = self.counter.load(SeqCst);
            let index = (seen & u64::from(u32::MAX)) as usize;
            if generation(seen) != gen || index >= self.tasks.load(SeqCst) {
                return;
            }
            let task = self.task.load(SeqCst);
            if self
                .counter
                .compare_exchange_weak(seen, seen + 1, SeqCst, SeqCst)
                .is_err()
            {
                continue;
            }
            // SAFETY: the claim succeeded, so fork-join `gen` was still current and this task
            // unfinished: its caller is inside `Team::run`, which returns only after `done`
            // counts this task, so the `Task` it published (read before the claim, and the one
            // of `gen`: the next fork-join stores its own only after this one's last claim) is
            // alive until the `done` increment below.
            let run = unsafe { *(task as *const Task<'_>) };
            let was_in_task = IN_TASK.with(|t| t.replace(true));
            let outcome = catch_unwind(AssertUnwindSafe(|| run(index)));
            IN_TASK.with(|t| t.set(was_in_task));
            if let Err(payload) = outcome {
                lock(&self.panic).get_or_insert(payload);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }

    /// Waits for a fork-join newer than `gen`; `None` when the team shuts down.
    fn next(&self, gen: u32) -> Option<u32> {
        let fresh = || {
            let now = generation(self.counter.load(SeqCst));
            (now != gen).then_some(now)
        };
        if self.spin {
            let started = Instant::now();
            'watch: loop {
                for _ in 0..SPINS_PER_CLOCK_READ {
                    if self.shutdown.load(SeqCst) {
                        return None;
                    }
                    if let Some(now) = fresh() {
                        return Some(now);
                    }
                    std::hint::spin_loop();
                }
                if started.elapsed() >= WORKER_SPIN {
                    break 'watch;
                }
            }
        }
        let mut guard = lock(&self.sleep);
        self.sleepers.fetch_add(1, SeqCst);
        let woken = loop {
            if self.shutdown.load(SeqCst) {
                break None;
            }
            if let Some(now) = fresh() {
                break Some(now);
            }
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.sleepers.fetch_sub(1, SeqCst);
        woken
    }

    /// Wakes sleeping workers after a new fork-join or the shutdown was published. A worker
    /// counts itself a sleeper before its last look, and this looks at the count after the
    /// publication (all sequentially consistent), so either it sees the news or it is woken.
    fn wake_sleepers(&self) {
        if self.sleepers.load(SeqCst) > 0 {
            let _guard = lock(&self.sleep);
            self.wake.notify_all();
        }
    }
}

/// A fixed set of threads that run fork-joins with their caller.
pub struct Team {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Team {
    /// A team of `threads` threads in all: the caller of each fork-join and `threads - 1`
    /// workers started now. An error if the OS refuses a thread (those started are stopped).
    pub fn new(threads: usize) -> std::io::Result<Team> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shared = Arc::new(Shared {
            counter: AtomicU64::new(CLOSED),
            tasks: AtomicUsize::new(0),
            task: AtomicPtr::new(ptr::null_mut()),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            turn: Mutex::new(()),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            spin: threads <= cores,
        });
        let mut team = Team {
            shared,
            workers: Vec::new(),
        };
        for i in 1..threads.max(1) {
            let shared = team.shared.clone();
            let worker = std::thread::Builder::new()
                .name(format!("spinkv-{i}"))
                .spawn(move || {
                    let mut gen = 0;
                    while let Some(now) = shared.next(gen) {
                        gen = now;
                        shared.work(gen);
                    }
                })?;
            team.workers.push(worker);
        }
        Ok(team)
    }

    /// Threads in the team, the caller's included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f` with this team current on the calling thread (the previous one restored after).
    pub fn install<R>(self: &Arc<Self>, f: impl FnOnce() -> R) -> R {
        let previous = CURRENT.with(|c| c.replace(Some(self.clone())));
        let _restore = Restore(previous);
        f()
    }

    /// Runs `task(i)` for every `i` in `0..n` on the team's threads and the caller's, and
    /// returns when all have finished. A task's panic is raised again here.
    pub fn run(&self, n: usize, task: &(dyn Fn(usize) + Sync)) {
        // Compared as u64: on a 32-bit target every usize fits, and `n <= MAX_TASKS` would be
        // a comparison with usize::MAX.
        assert!(
            n as u64 <= CLOSED,
            "a fork-join of {n} tasks (at most {MAX_TASKS})"
        );
        // A task that forks again (even through `install` on a worker) runs its fork-join in
        // place: the team is busy with the one that task belongs to.
        if n <= 1 || self.workers.is_empty() || IN_TASK.with(|t| t.get()) {
            return (0..n).for_each(task);
        }
        let shared = &*self.shared;
        let _turn = lock(&shared.turn);
        // Closed first: a worker that read the last fork-join's exhausted counter must not
        // find a task under it once the task count below grows.
        let last = generation(shared.counter.load(SeqCst));
        shared.counter.store(u64::from(last) << 32 | CLOSED, SeqCst);
        shared.done.store(0, SeqCst);
        shared.tasks.store(n, SeqCst);
        shared
            .task
            .store(&task as *const Task<'_> as *mut (), SeqCst);
        let gen = last.wrapping_add(1);
        shared.counter.store(u64::from(gen) << 32, SeqCst);
        shared.wake_sleepers();
        shared.work(gen);
        let mut spins = 0u32;
        while shared.done.load(SeqCst) < n {
            if spins < CALLER_SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        shared.task.store(ptr::null_mut(), SeqCst);
        if let Some(payload) = lock(&shared.panic).take() {
            resume_unwind(payload);
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        self.shared.wake_sleepers();
        for worker in self.workers.drain(..) {
            // A worker only leaves its loop; a join error would be a panic outside any task.
            let _ = worker.join();
        }
    }
}

thread_local! {
    /// The team fork-joins on this thread run on (see [`Team::install`]).
    static CURRENT: RefCell<Option<Arc<Team>>> = const { RefCell::new(None) };
    /// Whether this thread is running a team task.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// Puts back the thread's previous current team, also when a panic unwinds.
struct Restore(Option<Arc<Team>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

fn current() -> Option<Arc<Team>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Threads the current team runs a fork-join on (1 without one).
pub fn current_threads() -> usize {
    current().map_or(1, |team| team.threads())
}

/// `task(i)` for every `i` in `0..n`, on the current team (in place without one).
pub fn for_each(n: usize, task: impl Fn(usize) + Sync) {
    match current() {
        Some(team) => team.run(n, &task),
        None => (0..n).for_each(task),
    }
}

/// `task(item)` for every item, on the current team (in place without one). Items are claimed
/// in order, so put the costliest first.
pub fn for_each_mut<T: Send>(items: &mut [T], task: impl Fn(&mut T) + Sync) {
    let base = SendPtr(items.as_mut_ptr());
    let n = items.len();
    for_each(n, move |i| {
        let base = &base;
        assert!(i < n);
        // SAFETY: `i < n` indexes `items`, which stays mutably borrowed until every task has
        // finished, and the team hands out each index exactly once, so no two tasks alias.
        task(unsafe { &mut *base.0.add(i) })
    });
}

/// A pointer to items that tasks on other threads reach disjointly.
struct SendPtr<T>(*mut T);

// SAFETY: only `for_each_mut` makes one, for `T: Send` items it hands out one each.
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once() {
        let team = Arc::new(Team::new(3).unwrap());
        for n in [0usize, 1, 2, 7, 100, 1000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            team.install(|| {
                for_each(n, |i| {
                    hits[i].fetch_add(1, SeqCst);
                })
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "n = {n}");
        }
    }

    #[test]
    fn items_are_handed_out_disjointly() {
        let team = Arc::new(Team::new(2).unwrap());
        let mut items: Vec<u64> = (0..10_000).collect();
        team.install(|| for_each_mut(&mut items, |x| *x = *x * 2 + 1));
        assert!(items
            .iter()
            .enumerate()
            .all(|(i, &x)| x == i as u64 * 2 + 1));
    }

    #[test]
    fn nested_fork_joins_run_in_place() {
        let team = Arc::new(Team::new(2).unwrap());
        let total = AtomicUsize::new(0);
        team.install(|| {
            for_each(8, |_| {
                for_each(8, |_| {
                    total.fetch_add(1, SeqCst);
                });
            })
        });
        assert_eq!(total.load(SeqCst), 64);
    }

    #[test]
    fn a_task_that_installs_the_team_again_runs_in_place() {
        let team = Arc::new(Team::new(2).unwrap());
        let total = AtomicUsize::new(0);
        team.install(|| {
            for_each(6, |_| {
                team.install(|| {
                    for_each(4, |_| {
                        total.fetch_add(1, SeqCst);
                    })
                })
            })
        });
        assert_eq!(total.load(SeqCst), 24);
    }

    #[test]
    fn a_task_panic_reaches_the_caller_and_the_team_goes_on() {
        let team = Arc::new(Team::new(2).unwrap());
        let caught = catch_unwind(AssertUnwindSafe(|| {
            team.install(|| for_each(16, |i| assert!(i != 11, "task eleven")))
        }));
        assert!(caught.is_err());
        let hits = AtomicUsize::new(0);
        team.install(|| {
            for_each(16, |_| {
                hits.fetch_add(1, SeqCst);
            })
        });
        assert_eq!(hits.load(SeqCst), 16);
        assert_eq!(
            current_threads(),
            1,
            "install restored no team after the panic"
        );
    }

    /// Many callers on one team, many short fork-joins, workers asleep and awake in turn: the
    /// shape that deadlocked rayon pollers. Every fork-join must finish with every task once
    /// (a first version ran a task twice when a worker read the last fork-join's spent counter
    /// against the next one's task count: this caught it about one run in ten, hence ten).
    #[test]
    fn callers_take_turns_on_one_team() {
        for _ in 0..10 {
            callers_take_turns(Arc::new(Team::new(3).unwrap()));
        }
    }

    fn callers_take_turns(team: Arc<Team>) {
        std::thread::scope(|s| {
            for caller in 0..4u64 {
                let team = team.clone();
                s.spawn(move || {
                    team.install(|| {
                        for round in 0..2_000u64 {
                            let mut items = vec![0u64; (round % 13) as usize + 2];
                            for_each_mut(&mut items, |x| *x += caller + 1);
                            assert!(
                                items.iter().all(|&x| x == caller + 1),
                                "{caller} {round} {items:?}"
                            );
                            if round % 500 == 0 {
                                std::thread::sleep(WORKER_SPIN * 2);
                            }
                        }
                    })
                });
            }
        });
    }

    #[test]
    fn one_thread_runs_in_place_and_dropping_stops_the_workers() {
        let solo = Arc::new(Team::new(1).unwrap());
        assert_eq!(solo.threads(), 1);
        let here = std::thread::current().id();
        solo.install(|| for_each(4, |_| assert_eq!(std::thread::current().id(), here)));
        let team = Team::new(4).unwrap();
        std::thread::sleep(WORKER_SPIN * 2); // the workers asleep
        drop(team);
    }
}
