//! A three-node RabbitMQ cluster on this machine (`cluster_support`: three node names and
//! port sets on loopback, started and joined by the test, stopped and deleted
//! afterwards), and two workers draining 10,000 messages from a quorum queue through the
//! loss of a node:
//!
//! - the node the workers are connected to stops mid-drain;
//! - separately, the node that leads the queue stops mid-drain, the workers being
//!   connected to another node.
//!
//! In both, a publisher keeps publishing through the workers' node across the stop,
//! delayed messages are in the delay chain and poison messages between their attempts
//! when the node goes. Every message is handled, none is lost, duplicates are counted and
//! bounded, the delayed messages come out after the stop, the poison messages end in
//! the dead letters, and the time from the stop to the first message handled after it
//! is printed. The nodes are the broker's own program, so these tests run where
//! RabbitMQ is installed; they are `#[ignore]`d in the parallel suite (three more
//! brokers would starve the other tests) and `scripts/test` runs them alone:
//! `cargo nextest run -p transport-amqp --test cluster --run-ignored only`.

mod cluster_support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::{endpoint, node_name, Cluster, NODES};
use queue_core::worker::{handler_fn, JobContext, JobError, Worker, WorkerOptions};
use queue_core::{CancellationToken, DeadLetters, Envelope, QueueName, Transport};
use transport_amqp::{AmqpOptions, AmqpTransport};
use uuid::Uuid;

const MESSAGES: usize = 10_000;
const WORKERS: usize = 2;
const DELAYED: usize = 20;
const POISON: usize = 5;
/// The delay of the delayed messages and of the poison messages' retry: longer than a
/// node takes to stop (4 to 6 s here), so that each is in the delay chain while the node
/// goes away and comes out after.
const ACROSS: Duration = Duration::from_secs(8);
/// Messages per publish of the publisher that runs across the stop.
const PUBLISH_BATCH: usize = 20;
/// The drain's end is awaited this long at most.
const DRAIN_DEADLINE: Duration = Duration::from_secs(120);

fn skip() -> bool {
    if cluster_support::installed() {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "rabbitmq-server is not installed; under CI=true the cluster tests must run"
    );
    eprintln!("SKIPPED: RabbitMQ cluster tests: rabbitmq-server is not installed");
    true
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Every node's URL, `first` first; a lost node's operations wait up to two minutes
/// for the next.
async fn connect(cluster: &Cluster, first: usize) -> Arc<AmqpTransport> {
    Arc::new(
        AmqpTransport::connect(options(cluster, first))
            .await
            .expect("connect to the cluster"),
    )
}

fn options(cluster: &Cluster, first: usize) -> AmqpOptions {
    AmqpOptions::new(cluster.url_from(first)).with_reconnect_timeout(Duration::from_secs(120))
}

fn worker_options() -> WorkerOptions {
    WorkerOptions::default()
        .with_concurrency(8)
        .with_poll(Duration::from_millis(20), Duration::from_millis(500))
}

/// When each message was handled; more than once is a duplicate.
#[derive(Debug, Default)]
struct Seen {
    jobs: HashMap<Uuid, Vec<Instant>>,
    /// Handlings of jobs delivered again (a delivery count above zero: back from a
    /// lost channel), which only a surviving node can have delivered.
    redelivered: Vec<Instant>,
    poison: HashMap<Uuid, Vec<Instant>>,
}

type Shared = Arc<Mutex<Seen>>;

fn worker(t: Arc<AmqpTransport>, q: &QueueName, seen: &Shared) -> Worker {
    let poison = seen.clone();
    let jobs = seen.clone();
    Worker::new(t as Arc<dyn Transport>, q.clone(), worker_options())
        .handle(
            "poison",
            handler_fn(move |ctx: JobContext| {
                if let Ok(mut s) = poison.lock() {
                    let at = Instant::now();
                    s.poison.entry(ctx.envelope.id).or_default().push(at);
                }
                async { Err(JobError::retry_after(ACROSS, "poison: fails every time")) }
            }),
        )
        .handle_any(handler_fn(move |ctx: JobContext| {
            if let Ok(mut s) = jobs.lock() {
                let at = Instant::now();
                s.jobs.entry(ctx.envelope.id).or_default().push(at);
                if ctx.attempt > 1 {
                    s.redelivered.push(at);
                }
            }
            async {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok(())
            }
        }))
}

fn jobs(queue: &QueueName, n: usize, what: &str) -> Vec<Envelope> {
    (0..n)
        .map(|i| {
            Envelope::builder(queue.as_str(), "job")
                .payload(&serde_json::json!({ what: i }))
                .build()
                .expect("envelope")
        })
        .collect()
}

/// What the publisher running across the stop got confirmed.
#[derive(Debug, Default)]
struct Published {
    /// Each id whose publish returned `Ok`, with when.
    confirmed: Vec<(Uuid, Instant)>,
    /// Publishes that failed and were sent again with the same ids: each may have
    /// reached the queue anyway, so it may add a batch of duplicates.
    retried: usize,
}

/// Publishes small batches until `stop`, sending a failed batch again (same ids) until
/// it is confirmed; finishes the batch under way when stopped.
async fn publish_across(t: Arc<AmqpTransport>, q: QueueName, stop: CancellationToken) -> Published {
    let mut out = Published::default();
    while !stop.is_cancelled() {
        let batch = jobs(&q, PUBLISH_BATCH, "across");
        loop {
            match t.publish_batch(batch.clone()).await {
                Ok(_) => break,
                Err(e) => {
                    eprintln!("publish failed, sending the batch again: {e}");
                    out.retried += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let at = Instant::now();
        out.confirmed.extend(batch.iter().map(|e| (e.id, at)));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

async fn wait_for(seen: &Shared, what: &str, done: impl Fn(&Seen) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.lock().is_ok_and(|s| done(&s)) {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Which node the test stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// The node the workers and the publisher are connected to (not the queue's leader).
    WorkersNode,
    /// The node leading the queue (not the workers' node).
    QueueLeader,
}

/// Starts a cluster, drains through the loss, checks and reports, and checks that the
/// cluster is gone afterwards.
fn a_drain_survives(loss: Loss) {
    if skip() {
        return;
    }
    let cluster = Cluster::start();
    runtime().block_on(drain_across(&cluster, loss));
    drop(cluster);
    assert!(
        cluster_support::registered_nodes().is_empty(),
        "nodes left running: {:?}",
        cluster_support::registered_nodes()
    );
    assert!(
        cluster_support::files_removed(),
        "the cluster's files were left"
    );
}

async fn drain_across(cluster: &Cluster, loss: Loss) {
    // The transport's account of reconnects and of consumers stopped or cancelled (at
    // debug: a few lines), shown when the case fails (nextest prints a failing test's
    // output).
    let _ = tracing_subscriber::fmt()
        .with_env_filter("transport_amqp=debug")
        .with_test_writer()
        .try_init();
    let q = QueueName::new("cluster.drain").expect("queue name");
    // Declared through node 0, which then leads the queue, its dead-letter queue and the
    // delay chain (quorum queues are led where they are declared: `client-local`).
    let loader = connect(cluster, 0).await;
    assert_eq!(loader.connected_node(), endpoint(0));
    // First in the queue, so that each has failed once before the stop.
    let poison: Vec<Envelope> = (0..POISON)
        .map(|i| {
            Envelope::builder(q.as_str(), "poison")
                .payload(&serde_json::json!({ "poison": i }))
                .max_attempts(2)
                .build()
                .expect("envelope")
        })
        .collect();
    let poison_ids: HashSet<Uuid> = poison.iter().map(|e| e.id).collect();
    loader
        .publish_batch(poison)
        .await
        .expect("publish the poison");
    let load = jobs(&q, MESSAGES, "n");
    let mut expected: HashSet<Uuid> = load.iter().map(|e| e.id).collect();
    let loading = Instant::now();
    for chunk in load.chunks(1000) {
        loader
            .publish_batch(chunk.to_vec())
            .await
            .expect("publish with confirms");
    }
    let loaded_in = loading.elapsed();
    let (leader, members) = tokio::task::block_in_place(|| cluster.queue_leader(0, q.as_str()));
    let leader = leader.expect("the queue has a leader");
    assert_eq!(members.len(), NODES, "a member on every node: {members:?}");
    // The workers on a node that does not lead the queue, so that losing their node and
    // losing the leader are two separate events.
    let home = (leader + 1) % NODES;
    let victim = match loss {
        Loss::WorkersNode => home,
        Loss::QueueLeader => leader,
    };
    eprintln!(
        "{q} led by {}; the workers and the publisher on {}; {} will stop",
        node_name(leader),
        node_name(home),
        node_name(victim)
    );

    let seen: Shared = Arc::default();
    let stop = CancellationToken::new();
    let mut transports = Vec::new();
    let mut running = Vec::new();
    for _ in 0..WORKERS {
        let t = connect(cluster, home).await;
        assert_eq!(t.connected_node(), endpoint(home));
        running.push(tokio::spawn(worker(t.clone(), &q, &seen).run(stop.clone())));
        transports.push(t);
    }
    let publisher = connect(cluster, home).await;
    let stop_publishing = CancellationToken::new();
    let publishing = tokio::spawn(publish_across(
        publisher.clone(),
        q.clone(),
        stop_publishing.clone(),
    ));

    wait_for(&seen, "the drain did not get going", |s| {
        s.jobs.len() >= MESSAGES / 5 && s.poison.len() == POISON
    })
    .await;
    // Due `ACROSS` after they are built, at the earliest.
    let built = Instant::now();
    let delayed: Vec<Envelope> = (0..DELAYED)
        .map(|i| {
            Envelope::builder(q.as_str(), "job")
                .payload(&serde_json::json!({ "delayed": i }))
                .delay(ACROSS)
                .build()
                .expect("envelope")
        })
        .collect();
    let delayed_ids: HashSet<Uuid> = delayed.iter().map(|e| e.id).collect();
    expected.extend(delayed_ids.iter().copied());
    publisher
        .publish_batch(delayed)
        .await
        .expect("publish the delayed messages");

    // When the workers and the publisher have all left the stopping node.
    let moved = (loss == Loss::WorkersNode).then(|| {
        let watched: Vec<Arc<AmqpTransport>> = transports
            .iter()
            .chain(std::iter::once(&publisher))
            .cloned()
            .collect();
        let gone = endpoint(victim);
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while watched.iter().any(|t| t.connected_node() == gone) {
                if Instant::now() > deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Some(Instant::now())
        })
    });
    let handled_before = seen.lock().map(|s| s.jobs.len()).unwrap_or(0);
    let stopping = Instant::now();
    tokio::task::block_in_place(|| cluster.stop_node(victim));
    // The node is gone (its VM exited) from here on.
    let stopped = Instant::now();
    eprintln!(
        "stopped {} after {handled_before} of {MESSAGES} handled; the stop took {:.1?}",
        node_name(victim),
        stopped - stopping
    );
    assert!(
        stopped < built + ACROSS,
        "the stop took so long that the delayed messages were due before it ended"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_publishing.cancel();
    let published = publishing.await.expect("the publishing task");
    let after_stop = published
        .confirmed
        .iter()
        .filter(|(_, at)| *at > stopped)
        .count();
    assert!(after_stop > 0, "nothing was published after the stop");
    expected.extend(published.confirmed.iter().map(|(id, _)| *id));

    // Every message, and the poison in the dead letters.
    let deadline = Instant::now() + DRAIN_DEADLINE;
    let dead = loop {
        let missing = seen
            .lock()
            .map(|s| {
                expected
                    .iter()
                    .filter(|id| !s.jobs.contains_key(id))
                    .count()
            })
            .unwrap_or(usize::MAX);
        let dead = publisher
            .dead_list(Some(&q), 100)
            .await
            .expect("list the dead letters");
        let dead_ids: HashSet<Uuid> = dead.iter().filter_map(|d| d.id.parse().ok()).collect();
        if missing == 0 && dead_ids.is_superset(&poison_ids) {
            break dead;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} messages never handled, {} of {POISON} poison messages dead, {:?} after the stop",
            expected.len(),
            dead_ids.intersection(&poison_ids).count(),
            DRAIN_DEADLINE
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Nothing left in the queue nor in the workers' hands, so that any late redelivery
    // is counted below. Asked of the workers' transports: their stats add what their
    // consumers received but did not hand out (ready) or hold unacknowledged (reserved).
    // (Not `delayed`: a publisher counts its delayed messages until 30 s past due
    // unless it consumed them itself.)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut left = 0;
        let mut each = Vec::new();
        for t in &transports {
            let stats = t.stats(Some(&q)).await.expect("stats");
            left += stats.iter().map(|s| s.ready + s.reserved).sum::<u64>();
            each.push(
                stats
                    .iter()
                    .map(|s| (s.ready, s.reserved))
                    .collect::<Vec<_>>(),
            );
        }
        if left == 0 {
            break;
        }
        if Instant::now() >= deadline {
            // Where they are: the broker's own counts beside each worker's (ready
            // includes what a consumer received but did not hand out).
            let survivor = (victim + 1) % NODES;
            let broker = tokio::task::block_in_place(|| cluster.queue_counts(survivor));
            let handled = seen.lock().map(|s| s.jobs.len()).unwrap_or(0);
            panic!(
                "{left} messages still ready or held 30 s after the drain; per worker (ready, held): {each:?}; {handled} distinct handled; the broker: {broker}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for r in running {
        r.await.expect("worker task").expect("worker");
    }

    let moved = match moved {
        Some(task) => Some(
            task.await
                .expect("the watch of the connections")
                .expect("the connections left the stopped node within a minute")
                - stopping,
        ),
        None => None,
    };
    let seen = std::mem::take(&mut *seen.lock().expect("seen"));
    let unknown: Vec<&Uuid> = seen
        .jobs
        .keys()
        .filter(|id| !expected.contains(id))
        .collect();
    assert!(unknown.is_empty(), "handled, never published: {unknown:?}");
    let duplicates: usize = seen.jobs.values().map(|at| at.len() - 1).sum();
    // At-least-once: when a consumer's channel closes (its connection lost, or the
    // broker closing it), the queue gives back everything it had delivered on it and not
    // seen settled, handled or not, acked even (an ack the queue had not applied yet).
    // Pushed deliveries are at most the consumer's prefetch (`basic.qos`); `basic.get`s,
    // which the prefetch does not count, are taken only while the worker's window
    // (claimed ahead, running, awaiting their coalesced ack) has room. So the bound is
    // the two together per worker, for one close each: loose (it counts buffered
    // deliveries never handled), but it still catches a redelivery loop. Plus a batch
    // per publish that failed but may have landed before it was sent again. Usually nothing closes
    // in a leader's loss and no message comes twice (nine runs in a row here); once in
    // CI 1,569 did, more than the worker's window alone. The likely cause, not seen
    // directly: RabbitMQ 3.10.8 (Debian's) fetches deliveries a channel missed across a
    // leader change in a way that can crash the channel (changed in 3.10.9,
    // rabbitmq-server 1f0c202), which gives back its whole prefetch. The transport's
    // log, printed with a failure, shows a consumer stopped.
    let o = worker_options();
    let pushed = usize::from(options(cluster, home).prefetch);
    let bound = WORKERS * (pushed + o.prefetch + o.concurrency + o.ack_batch)
        + PUBLISH_BATCH * published.retried;
    assert!(
        duplicates <= bound,
        "{duplicates} handled twice, more than the {bound} the workers could have held"
    );

    let mut times: Vec<Instant> = seen.jobs.values().flatten().copied().collect();
    times.extend(seen.poison.values().flatten().copied());
    times.sort();
    let first_after = times
        .iter()
        .find(|at| **at > stopped)
        .map(|at| *at - stopped)
        .expect("messages handled after the stop");
    // The first message handled after the stop may be one a worker held already, so
    // these say more: the longest stall in handling from the stop's start on, and the
    // first message handled again, which a surviving node delivered.
    let longest_pause = longest_gap(stopping, &times);
    let first_redelivered = seen
        .redelivered
        .iter()
        .filter(|at| **at > stopping)
        .min()
        .map(|at| *at - stopping);
    let drained_in = times.last().map(|at| *at - stopping).unwrap_or_default();
    // And for the publisher: the longest wait for a confirm from the stop's start on.
    let mut confirms: Vec<Instant> = published.confirmed.iter().map(|(_, at)| *at).collect();
    confirms.sort();
    confirms.dedup();
    let longest_unconfirmed = longest_gap(stopping, &confirms);

    // The delay chain: every delayed message came out after the stop, none early (a
    // 100 ms margin for the wall clock the transport compares against).
    let mut delays = Vec::new();
    for id in &delayed_ids {
        let at = seen.jobs[id][0];
        assert!(
            at + Duration::from_millis(100) >= built + ACROSS,
            "a delayed message came {:?} early",
            built + ACROSS - at
        );
        assert!(
            at > stopped,
            "a delayed message came out before the stop ended"
        );
        delays.push(at - built);
    }
    delays.sort();
    // The dead letters: the poison failed once before the stop, again after it, and is
    // dead, whichever node held its queue or the dead-letter queue.
    for (id, attempts) in &seen.poison {
        assert!(
            attempts[0] < stopping,
            "poison {id} first ran after the stop began"
        );
        assert!(
            attempts.iter().skip(1).all(|at| *at > stopped),
            "poison {id} ran again before the stop ended"
        );
    }
    let dead_ids: HashSet<Uuid> = dead.iter().filter_map(|d| d.id.parse().ok()).collect();
    assert_eq!(dead_ids, poison_ids, "exactly the poison messages are dead");

    let nodes: Vec<String> = transports
        .iter()
        .chain(std::iter::once(&publisher))
        .map(|t| t.connected_node())
        .collect();
    match loss {
        Loss::WorkersNode => {
            for node in &nodes {
                assert_ne!(*node, endpoint(victim), "moved off the stopped node");
            }
        }
        Loss::QueueLeader => {
            let new_leader =
                tokio::task::block_in_place(|| cluster.leader_other_than(home, q.as_str(), victim));
            eprintln!("{q} is now led by {}", node_name(new_leader));
        }
    }
    eprintln!(
        "{loss:?}: {} stopped (it took {:.1?}), the queue's leader {}, the workers' node {}",
        node_name(victim),
        stopped - stopping,
        if victim == leader { "was" } else { "was not" },
        if victim == home { "was" } else { "was not" },
    );
    eprintln!(
        "  all {} handled: {MESSAGES} loaded in {loaded_in:.1?}, {} published across the stop \
         ({after_stop} after it, {} publishes sent again), {DELAYED} delayed, the last handled \
         {drained_in:.1?} after the stop began",
        expected.len(),
        published.confirmed.len(),
        published.retried,
    );
    eprintln!(
        "  {duplicates} handled twice (bound {bound}); first message handled {first_after:.1?} \
         after the node was gone; from the stop's start, the longest pause in handling \
         {longest_pause:.1?} and the longest wait for a publish confirm {longest_unconfirmed:.1?}"
    );
    let again = first_redelivered.map_or("never".to_owned(), |d| format!("{d:.1?} after it"));
    match moved {
        Some(moved) => eprintln!(
            "  the connections left the node {moved:.1?} after the stop began; the first \
             message delivered again (by a surviving node) was handled {again}"
        ),
        None => eprintln!(
            "  the connections stayed on {}; a message delivered again was handled {again}",
            node_name(home)
        ),
    }
    eprintln!(
        "  delayed messages handled {:.1?} to {:.1?} after publishing (due at {ACROSS:?}); \
         {POISON} poison messages dead ({} dead letters); connections now on {nodes:?}",
        delays.first().copied().unwrap_or_default(),
        delays.last().copied().unwrap_or_default(),
        dead.len(),
    );
}

/// The longest time between consecutive instants of `times` (sorted) from `from` on.
fn longest_gap(from: Instant, times: &[Instant]) -> Duration {
    let since: Vec<Instant> = std::iter::once(from)
        .chain(times.iter().copied().filter(|at| *at > from))
        .collect();
    since
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

#[test]
#[ignore = "starts a three-node RabbitMQ cluster: run alone (scripts/test does)"]
fn a_drain_survives_the_loss_of_the_node_its_workers_are_connected_to() {
    a_drain_survives(Loss::WorkersNode);
}

#[test]
#[ignore = "starts a three-node RabbitMQ cluster: run alone (scripts/test does)"]
fn a_drain_survives_the_loss_of_the_node_leading_its_queue() {
    a_drain_survives(Loss::QueueLeader);
}

/// The harness itself: three joined nodes, a quorum queue with a member on each, a new
/// leader after its leader stops, and nothing left after.
#[test]
#[ignore = "starts a three-node RabbitMQ cluster: run alone (scripts/test does)"]
fn the_cluster_harness_joins_three_nodes_and_leaves_nothing_behind() {
    if skip() {
        return;
    }
    let cluster = Cluster::start();
    for ask in 0..NODES {
        let running = cluster.running_nodes(ask);
        assert_eq!(
            running,
            (0..NODES).map(node_name).collect::<Vec<_>>(),
            "{} sees every node running",
            node_name(ask)
        );
    }
    let q = QueueName::new("cluster.harness").expect("queue name");
    // One runtime for the transport's whole life: its connection's tasks run on it.
    let rt = runtime();
    let t = rt.block_on(async {
        let t = connect(&cluster, 1).await;
        t.publish_batch(jobs(&q, 1, "n")).await.expect("publish");
        t
    });
    let (leader, members) = cluster.queue_leader(0, q.as_str());
    let leader = leader.expect("the queue has a leader");
    assert_eq!(members.len(), NODES, "a member on every node: {members:?}");
    let other = (leader + 1) % NODES;
    cluster.stop_node(leader);
    assert_eq!(cluster.running_nodes(other).len(), NODES - 1);
    let new_leader = cluster.leader_other_than(other, q.as_str(), leader);
    eprintln!(
        "{q}: leader {} stopped, {} elected",
        node_name(leader),
        node_name(new_leader)
    );
    let ready = rt.block_on(async {
        let stats = t.stats(Some(&q)).await.expect("stats");
        t.close().await;
        stats.iter().map(|s| s.ready).sum::<u64>()
    });
    assert_eq!(ready, 1, "the message outlived its leader");
    drop(cluster);
    assert!(cluster_support::registered_nodes().is_empty());
    assert!(cluster_support::files_removed());
}
