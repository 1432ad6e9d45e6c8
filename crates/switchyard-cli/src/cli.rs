//! The command line, as in the contract's synopsis. Global flags mirror the environment.

use clap::{Args, Parser, Subcommand};

/// Durable background jobs and messages over SQLite, PostgreSQL, MySQL and RabbitMQ.
#[derive(Debug, Parser)]
#[command(name = "switchyard", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Flags that override the environment variables of the same meaning. In a
/// subcommand's help they come after its own options, under their own heading.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct Global {
    /// exec (the SQL database of DATABASE_URL) or rabbitmq [env: QUEUE_BACKEND]
    #[arg(long, global = true)]
    pub(crate) backend: Option<String>,
    /// sqlite://PATH, postgres://… or mysql://… [env: DATABASE_URL]
    #[arg(long, global = true)]
    pub(crate) database_url: Option<String>,
    /// amqp://USER:PASSWORD@HOST:PORT/VHOST [env: AMQP_URL]
    #[arg(long, global = true)]
    pub(crate) amqp_url: Option<String>,
    /// skip-locked or optimistic [env: QUEUE_CLAIM]
    #[arg(long, global = true)]
    pub(crate) claim: Option<String>,
    /// Lease of a reservation, e.g. 90s [env: QUEUE_VISIBILITY_TIMEOUT]
    #[arg(long, global = true)]
    pub(crate) visibility_timeout: Option<String>,
    /// Table name [env: QUEUE_TABLE]
    #[arg(long, global = true)]
    pub(crate) table: Option<String>,
    /// The tenant: a PostgreSQL schema, a MySQL database, or the name put for {tenant}
    /// in DATABASE_URL (a SQLite file) and AMQP_URL (a RabbitMQ vhost). `work`, `stats` and
    /// `dead list` take several (a,b,c) or a pattern (acme_*) [env: QUEUE_SCHEMA]
    #[arg(long, global = true)]
    pub(crate) schema: Option<String>,
    /// Print JSON instead of text
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade the queue tables
    #[command(after_help = MIGRATE_EXAMPLES)]
    Migrate,
    /// Publish one message, or one per stdin line (a JSON payload each) without --payload
    #[command(after_help = PUBLISH_EXAMPLES)]
    Publish(PublishArgs),
    /// Run a command once per message (any language): envelope on stdin
    #[command(after_help = WORK_EXAMPLES)]
    Work(WorkArgs),
    /// Counts per queue: ready, delayed, reserved, dead
    #[command(after_help = STATS_EXAMPLES)]
    Stats(StatsArgs),
    /// One job: state, attempts with their errors, payload, result, times, and where it is
    #[command(after_help = JOB_EXAMPLES)]
    Job(JobArgs),
    /// Inspect, replay and purge dead letters
    #[command(after_help = DEAD_EXAMPLES)]
    Dead {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// A first run on the embedded default: publish and work 1,000 invoice jobs
    #[command(after_help = DEMO_EXAMPLES)]
    Demo(DemoArgs),
    /// Measure enqueue, drain and pickup latency
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
    /// The bench's publisher in another process (run by `bench` itself)
    #[command(name = "bench-publish", hide = true)]
    BenchPublish(BenchPublishArgs),
    /// The bench's worker in another process (run by `bench` itself)
    #[command(name = "bench-drain", hide = true)]
    BenchDrain(BenchDrainArgs),
    /// Forward a queue from the SQL store (the outbox) to RabbitMQ, with confirms
    #[command(after_help = RELAY_EXAMPLES)]
    Relay(RelayArgs),
    /// Move what is left of a queue (delayed messages and dead letters included) to the
    /// other backend
    #[command(after_help = MOVE_EXAMPLES)]
    Move(MoveArgs),
    /// Delete job results, checkpoints, job logs and dead letters older than a given age
    #[command(after_help = PRUNE_EXAMPLES)]
    Prune(PruneArgs),
    /// The admin server: dashboard, JSON API, live job events and Prometheus metrics
    #[command(after_help = SERVE_EXAMPLES)]
    Serve(ServeArgs),
    /// Stop every worker from starting a queue's jobs (or one kind's) until resumed
    #[command(after_help = PAUSE_EXAMPLES)]
    Pause(PauseArgs),
    /// Let workers start a paused queue's (or kind's) jobs again
    #[command(after_help = PAUSE_EXAMPLES)]
    Resume(PauseArgs),
    /// Cancel jobs by id or by filter: a waiting job never runs, a running one's handler
    /// is cancelled; both end `cancelled`
    #[command(after_help = CANCEL_EXAMPLES)]
    Cancel(CancelArgs),
    /// Report the running job's progress, from a command of `work --exec`
    #[command(after_help = PROGRESS_EXAMPLES)]
    Progress(ProgressArgs),
    /// Store the running job's checkpoint, from a command of `work --exec`: its next
    /// delivery finds it in SWITCHYARD_CHECKPOINT
    #[command(after_help = CHECKPOINT_EXAMPLES)]
    Checkpoint(CheckpointArgs),
    /// Periodic jobs: apply a file of schedules, add, pause, resume, trigger, remove, list
    #[command(after_help = SCHEDULE_EXAMPLES)]
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
}

const PROGRESS_EXAMPLES: &str = "Examples (inside a command of switchyard work --exec):
  switchyard progress 40 \"rendering\"
  switchyard progress 100

It reaches the worker running the command through SWITCHYARD_CONTROL_SOCKET, under the
job's SWITCHYARD_LEASE_TOKEN. A report the worker cannot take exits 1: a command whose
run was overtaken (its worker lost the lease), a worker without job status, a worker
already gone. Write `switchyard progress 40 || true` where a report must not fail the
job under `set -e`. The job's status shows it (switchyard job ID, serve).";

#[derive(Debug, Args)]
pub(crate) struct ProgressArgs {
    /// Percent done, 0 to 100
    #[arg(value_parser = clap::value_parser!(u8).range(0..=100))]
    pub(crate) percent: u8,
    /// A short note on what it is doing
    pub(crate) note: Option<String>,
}

const CHECKPOINT_EXAMPLES: &str = "Examples (inside a command of switchyard work --exec):
  switchyard checkpoint '{\"done\": 5000}'
  switchyard checkpoint 5000
  echo \"$cursor_json\" | switchyard checkpoint -

The value is JSON, at most 64 KiB. The worker stores it (in the SQL store beside the
jobs; for RabbitMQ, its DATABASE_URL control store) before this returns, and only while
the job's run holds its lease: a command whose run was overtaken exits 1 and should stop,
its checkpoint refused. A later delivery of the job (after a crash, a deploy, a retry or a
replay) gets the last one in SWITCHYARD_CHECKPOINT (empty when there is none); it is
removed once the job completes.";

#[derive(Debug, Args)]
pub(crate) struct CheckpointArgs {
    /// The checkpoint: JSON text, or - to read it from stdin
    pub(crate) value: String,
}

const SCHEDULE_EXAMPLES: &str = "Examples:
  switchyard schedule apply schedules.toml
  switchyard schedule add nightly-report --cron '0 3 * * *' --timezone Europe/Berlin \\
      --queue reports --kind nightly --payload '{\"region\":\"eu\"}'
  switchyard schedule add heartbeat --every 30s --queue ops --kind ping --catch-up skip
  switchyard schedule list
  switchyard schedule trigger nightly-report

A schedules file holds [[schedule]] tables with the fields of `schedule add`:
  [[schedule]]
  name = \"nightly-report\"
  cron = \"0 3 * * *\"
  timezone = \"Europe/Berlin\"
  queue = \"reports\"
  kind = \"nightly\"
  payload = { region = \"eu\" }
  catch_up = \"all\"  # skip, latest (the default) or all
  max_runs = 10     # with all: at most this many missed slots fired
  within = \"6h\"     # with all: only slots this recent

Running workers fire due slots (every `switchyard work` sharing the store); each slot
makes one job however many workers there are.";

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Store the schedules of a TOML file; applying it again changes nothing
    Apply(ScheduleApplyArgs),
    /// Add a schedule, or change the one of that name (a new cadence starts from now)
    Add(ScheduleAddArgs),
    /// Stop a schedule from firing until resumed
    Pause(ScheduleNameArgs),
    /// Fire a paused schedule again, from its next slot (the paused ones do not run)
    Resume(ScheduleNameArgs),
    /// Publish a job of a schedule now, outside its slots
    Trigger(ScheduleNameArgs),
    /// Delete a schedule (its published jobs stay)
    Rm(ScheduleNameArgs),
    /// Every schedule with its next run
    List,
}

#[derive(Debug, Args)]
pub(crate) struct ScheduleApplyArgs {
    /// The TOML file
    pub(crate) file: std::path::PathBuf,
    /// Also delete the stored schedules the file does not name
    #[arg(long)]
    pub(crate) prune: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ScheduleNameArgs {
    /// The schedule's name
    pub(crate) name: String,
}

#[derive(Debug, Args)]
pub(crate) struct ScheduleAddArgs {
    /// The schedule's name: letters, digits, '.', '_', '-', ':'
    pub(crate) name: String,
    /// A cron pattern: 5 fields, or 6 with seconds first
    #[arg(long, conflicts_with = "every")]
    pub(crate) cron: Option<String>,
    /// An interval instead of a cron pattern, e.g. 15m (slots at its multiples since
    /// the epoch)
    #[arg(long, value_name = "DUR")]
    pub(crate) every: Option<String>,
    /// The IANA time zone of the cron pattern (UTC)
    #[arg(long, value_name = "ZONE")]
    pub(crate) timezone: Option<String>,
    /// The queue its jobs go to
    #[arg(long)]
    pub(crate) queue: String,
    /// Their kind
    #[arg(long)]
    pub(crate) kind: String,
    /// Their JSON payload ({})
    #[arg(long)]
    pub(crate) payload: Option<String>,
    /// Missed slots: skip, latest (fire the latest once) or all
    #[arg(long, value_name = "POLICY")]
    pub(crate) catch_up: Option<String>,
    /// With --catch-up all: at most this many missed slots fired (100)
    #[arg(long, value_name = "N")]
    pub(crate) max_runs: Option<u32>,
    /// With --catch-up all: only missed slots this recent (1h)
    #[arg(long, value_name = "DUR")]
    pub(crate) within: Option<String>,
}

const PAUSE_EXAMPLES: &str = "Examples:
  switchyard pause invoices
  switchyard pause invoices --kind reminder
  switchyard resume invoices";

const CANCEL_EXAMPLES: &str = "Examples:
  switchyard cancel 0195e2c4-7d1a-7b8e-9c55-3f1d2a6b8e90
  switchyard cancel --queue imports --state pending --older-than 1h --dry-run
  switchyard cancel --queue imports --kind csv";

#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The queue
    pub(crate) queue: String,
    /// Only this kind of the queue's jobs
    #[arg(long)]
    pub(crate) kind: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    /// Jobs to cancel, by id
    pub(crate) ids: Vec<String>,
    /// Every unfinished job of this queue (with the other filters)
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// Only jobs of this kind
    #[arg(long)]
    pub(crate) kind: Option<String>,
    /// Only jobs in this state: pending, retrying or running
    #[arg(long)]
    pub(crate) state: Option<String>,
    /// Only jobs published longer ago than this, e.g. 1h
    #[arg(long, value_name = "DUR")]
    pub(crate) older_than: Option<String>,
    /// Count what would be cancelled, and cancel nothing
    #[arg(long)]
    pub(crate) dry_run: bool,
}

const MIGRATE_EXAMPLES: &str = "Examples:
  DATABASE_URL=sqlite://jobs.db switchyard migrate
  switchyard migrate --database-url postgres://app@db.internal/app --schema jobs
  QUEUE_BACKEND=rabbitmq AMQP_URL=amqps://user:pw@mq.example.com/prod switchyard migrate";

const PUBLISH_EXAMPLES: &str = "Examples:
  switchyard publish --queue emails --kind welcome --payload '{\"user\": 42}'
  jq -c '.[]' users.json | switchyard publish --queue emails --kind welcome
  switchyard publish --queue reports --kind monthly --payload '{}' --wait 60s";

const WORK_EXAMPLES: &str = "Examples:
  switchyard work --queue emails --exec ./send-email.sh
  switchyard work --queue imports --exec 'python3 import.py' --concurrency 4 --timeout 10m
  switchyard work --queue emails --exec ./send-email.sh --drain";

const STATS_EXAMPLES: &str = "Examples:
  switchyard stats
  switchyard stats --queue emails --json";

const JOB_EXAMPLES: &str = "Examples:
  switchyard job 0195e2c4-7d1a-7b8e-9c55-3f1d2a6b8e90
  switchyard job \"$(switchyard publish --queue q --kind k --payload '{}')\" --json";

const DEAD_EXAMPLES: &str = "Examples:
  switchyard dead list --queue emails --payload
  switchyard dead replay --id 0195e2c4-7d1a-7b8e-9c55-3f1d2a6b8e90
  switchyard dead purge --older-than 30d";

const DEMO_EXAMPLES: &str = "Examples:
  switchyard demo
  switchyard demo --jobs 10000";

const BENCH_EXAMPLES: &str = "Examples:
  switchyard bench
  DATABASE_URL=postgres://localhost/test switchyard bench --runs 5
  QUEUE_BACKEND=rabbitmq switchyard bench --messages 50000";

const RELAY_EXAMPLES: &str = "Examples:
  DATABASE_URL=postgres://app@db/app AMQP_URL=amqp://mq switchyard relay --queue events
  switchyard relay --queue events --drain";

const MOVE_EXAMPLES: &str = "Examples:
  switchyard move --from exec --to rabbitmq --queue emails
  switchyard move --from rabbitmq --to exec --queue emails --batch 1000";

const PRUNE_EXAMPLES: &str = "Examples:
  switchyard prune --older-than 30d
  switchyard prune --older-than 12h --database-url postgres://app@db/app";

const SERVE_EXAMPLES: &str = "Examples:
  switchyard serve
  SWITCHYARD_ADMIN_TOKEN=$(openssl rand -hex 16) switchyard serve --listen 0.0.0.0:8080
  SWITCHYARD_ALERT_WEBHOOK=https://hooks.slack.com/services/… switchyard serve --alert-failure-rate 0.1";

#[derive(Debug, Args)]
pub(crate) struct JobArgs {
    /// The job's id (what publish printed)
    pub(crate) id: String,
}

#[derive(Debug, Args)]
pub(crate) struct MoveArgs {
    /// The backend to empty: exec or rabbitmq
    #[arg(long)]
    pub(crate) from: String,
    /// The backend to fill: exec or rabbitmq
    #[arg(long)]
    pub(crate) to: String,
    /// Queue to move
    #[arg(long)]
    pub(crate) queue: String,
    /// Messages per batch
    #[arg(long, default_value_t = 500)]
    pub(crate) batch: usize,
}

#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// Queue to forward
    #[arg(long)]
    pub(crate) queue: String,
    /// Messages forwarded per confirmed batch
    #[arg(long, default_value_t = 100)]
    pub(crate) batch: usize,
    /// Exit once the queue is empty in the SQL store
    #[arg(long)]
    pub(crate) drain: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// Queue name (letters, digits, _ - . :)
    #[arg(long)]
    pub(crate) queue: String,
    /// Message kind that selects the handler
    #[arg(long)]
    pub(crate) kind: String,
    /// JSON payload; without it, one payload per stdin line
    #[arg(long)]
    pub(crate) payload: Option<String>,
    /// Message id (UUID); publishing the same id twice stores one message
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Deliver after this delay, e.g. 10s, 5m
    #[arg(long)]
    pub(crate) delay: Option<String>,
    /// Higher is delivered first (-32768..32767)
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) priority: Option<i16>,
    /// Never deliver after this long, e.g. 1h
    #[arg(long)]
    pub(crate) expires_in: Option<String>,
    /// Attempts before the message is dead-lettered
    #[arg(long)]
    pub(crate) max_attempts: Option<u32>,
    /// Correlation id
    #[arg(long)]
    pub(crate) trace_id: Option<String>,
    /// Header KEY=VALUE (repeatable)
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub(crate) headers: Vec<String>,
    /// Messages of the queue with the same key are handled one at a time, in publish order
    #[arg(long, value_name = "KEY")]
    pub(crate) ordering_key: Option<String>,
    /// At most one job of the queue holds this key: a publish that finds it held stores
    /// nothing and prints the holder's id
    #[arg(long, value_name = "KEY")]
    pub(crate) unique_key: Option<String>,
    /// How long a job holds its unique key: pending (until claimed), active (until acked
    /// or dead-lettered; the default), or done:PERIOD (and PERIOD after the ack)
    #[arg(long, value_name = "SCOPE", requires = "unique_key")]
    pub(crate) unique_scope: Option<String>,
    /// What a publish that finds the unique key held does: reject (the default),
    /// replace:MAX_WAIT (debounce: move the waiting job's due time and payload, never
    /// past MAX_WAIT after its first publish) or throttle:TTL (hold the key TTL after each
    /// publish)
    #[arg(long, value_name = "RULE", requires = "unique_key")]
    pub(crate) on_conflict: Option<String>,
    /// A label workers can select by (`work --label`); repeat for several
    #[arg(long = "label", value_name = "LABEL")]
    pub(crate) labels: Vec<String>,
    /// Wait up to this long for the job to end, e.g. 10s, and print its result (exit 1
    /// when the job failed, 124 when no answer came in time)
    #[arg(long, value_name = "DUR")]
    pub(crate) wait: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct WorkArgs {
    /// Queue to work
    #[arg(long)]
    pub(crate) queue: String,
    /// Shell command run once per message: the envelope JSON on stdin; SWITCHYARD_MESSAGE_ID,
    /// SWITCHYARD_KIND, SWITCHYARD_ATTEMPT, SWITCHYARD_LABELS, SWITCHYARD_ORDERING_KEY,
    /// SWITCHYARD_CHECKPOINT (the last `switchyard checkpoint`) and TRACEPARENT in its
    /// environment; exit 0 acks, any other exit retries with backoff
    #[arg(long, value_name = "CMD")]
    pub(crate) exec: String,
    /// Messages handled at once
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) concurrency: u16,
    /// Kill a handler that runs longer than this, e.g. 10m (counts as a failure)
    #[arg(long)]
    pub(crate) timeout: Option<String>,
    /// Exit once nothing is ready, delayed or reserved on the queue
    #[arg(long)]
    pub(crate) drain: bool,
    /// Deliveries before a message is dead-lettered (a message's own max_attempts wins)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,
    /// First retry's backoff ceiling, doubling per attempt (full jitter)
    #[arg(long, default_value = "5s")]
    pub(crate) backoff_base: String,
    /// Largest backoff ceiling
    #[arg(long, default_value = "300s")]
    pub(crate) backoff_max: String,
    /// On SIGTERM/SIGINT, how long running handlers may finish before they are killed
    /// and their messages released
    #[arg(long, default_value = "30s")]
    pub(crate) grace: String,
    /// Serve Prometheus metrics of this worker at http://ADDR/metrics, e.g. 127.0.0.1:9187
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<String>,
    /// Every hour, delete job results, checkpoints, job logs and dead letters older than
    /// this, e.g. 30d (stored as the schedule switchyard.prune, which one worker of the
    /// store fires per slot)
    #[arg(long, value_name = "DUR")]
    pub(crate) prune_older_than: Option<String>,
    /// Do not keep the command's stderr as the job's log (shown by `switchyard job` and
    /// the dashboard): for commands whose stderr may hold secrets
    #[arg(long)]
    pub(crate) no_stderr_log: bool,
    /// With a pattern in --schema (acme_*): how often to look for new tenants to serve
    #[arg(long, value_name = "DUR", default_value = "30s")]
    pub(crate) tenant_rescan: String,
    /// Handle only messages carrying this label; repeat for any of several (none: every
    /// message). Not on RabbitMQ, which cannot pass over messages in a queue
    #[arg(long = "label", value_name = "LABEL")]
    pub(crate) labels: Vec<String>,
    /// A limit kept across every worker that declares it: BY[,kind=K][,concurrency=N]
    /// [,rate=N/PERIOD][,burst=N], BY one of queue, kind, header:NAME, field:/POINTER
    /// (header:tenant,concurrency=2 or queue,rate=50/s); repeat for several
    #[arg(long = "limit", value_name = "LIMIT")]
    pub(crate) limits: Vec<String>,
    /// This worker's name, recorded with host:pid as the holder of what it claims
    /// (`stats --held`, `switchyard job`, the dashboard)
    #[arg(long, env = "SWITCHYARD_WORKER_NAME", value_name = "NAME")]
    pub(crate) name: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct PruneArgs {
    /// Delete job results and dead letters that ended longer ago than this, e.g. 30d
    #[arg(long, value_name = "DUR")]
    pub(crate) older_than: String,
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on; the default keeps it to this machine
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub(crate) listen: String,
    /// Post each incident, when it opens and when it resolves, to this Slack-compatible
    /// webhook (a secret: prefer the environment variable)
    #[arg(
        long,
        env = "SWITCHYARD_ALERT_WEBHOOK",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) alert_webhook: Option<String>,
    /// Alert when at least this share of a queue's finished jobs failed in the window
    /// (0 to 1, or off)
    #[arg(long, default_value = "0.2", value_name = "RATE")]
    pub(crate) alert_failure_rate: String,
    /// Fewer finished jobs in the window never make a failure-rate alert
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub(crate) alert_min_finished: u64,
    /// The window of the failure rate and of dead-letter growth
    #[arg(long, default_value = "5m", value_name = "DUR")]
    pub(crate) alert_window: String,
    /// Alert when a queue's oldest ready message has waited this long (or off)
    #[arg(long, default_value = "15m", value_name = "DUR")]
    pub(crate) alert_oldest_ready: String,
    /// Alert when a queue gains this many dead letters within the window (or off)
    #[arg(long, default_value = "10", value_name = "N")]
    pub(crate) alert_dead_growth: String,
    /// Alert when messages are ready and no worker of their queue reported for this long
    /// (or off)
    #[arg(long, default_value = "2m", value_name = "DUR")]
    pub(crate) alert_no_workers: String,
    /// How often the alerts are evaluated
    #[arg(long, default_value = "15s", value_name = "DUR")]
    pub(crate) alert_every: String,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct StatsArgs {
    /// Only this queue
    #[arg(long)]
    pub(crate) queue: Option<String>,
    /// List the messages workers hold now: who holds each and until when
    #[arg(long)]
    pub(crate) held: bool,
    /// With --held, at most this many, longest held first
    #[arg(long, default_value_t = 100, requires = "held")]
    pub(crate) limit: usize,
    /// List the keys of workers' limits (`work --limit`): slots held and buckets
    #[arg(long, conflicts_with = "held")]
    pub(crate) limits: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub(crate) enum DeadCommand {
    /// List dead letters, oldest first
    List {
        /// Only this queue
        #[arg(long)]
        queue: Option<String>,
        /// At most this many
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Show each dead letter's payload (pretty JSON; a field `payload` with --json)
        #[arg(long)]
        payload: bool,
    },
    /// Put dead letters back on their queue with attempts reset
    Replay {
        /// The dead letter's id
        #[arg(long, required_unless_present_any = ["all", "kind", "older_than"], conflicts_with_all = ["all", "kind", "older_than"])]
        id: Option<String>,
        /// Every dead letter (of --queue when given)
        #[arg(long)]
        all: bool,
        /// Only this queue
        #[arg(long)]
        queue: Option<String>,
        /// Only dead letters of this kind
        #[arg(long)]
        kind: Option<String>,
        /// Only those dead for longer than this, e.g. 1h
        #[arg(long)]
        older_than: Option<String>,
        /// Count what would be replayed, and replay nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete dead letters
    Purge {
        /// The dead letter's id
        #[arg(long, conflicts_with_all = ["all", "older_than"])]
        id: Option<String>,
        /// Every dead letter (of --queue when given)
        #[arg(long, conflicts_with = "older_than")]
        all: bool,
        /// Those dead for longer than this, e.g. 30d
        #[arg(long, required_unless_present_any = ["id", "all", "kind"])]
        older_than: Option<String>,
        /// Only this queue
        #[arg(long)]
        queue: Option<String>,
        /// Only dead letters of this kind
        #[arg(long, conflicts_with = "id")]
        kind: Option<String>,
        /// Count what would be deleted, and delete nothing
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// How many invoice jobs to publish
    #[arg(long, default_value_t = 1_000)]
    pub(crate) jobs: usize,
}

#[derive(Debug, Args)]
pub(crate) struct BenchPublishArgs {
    /// The queue
    #[arg(long)]
    pub(crate) queue: String,
    /// Jobs to publish
    #[arg(long)]
    pub(crate) count: usize,
    /// Milliseconds between two
    #[arg(long = "interval-ms")]
    pub(crate) interval_ms: u64,
}

#[derive(Debug, Args)]
pub(crate) struct BenchDrainArgs {
    /// The queue
    #[arg(long)]
    pub(crate) queue: String,
    /// Handler slots
    #[arg(long)]
    pub(crate) concurrency: usize,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Jobs per drain and batched-enqueue measurement (each run first drains as many
    /// more, at most 5,000, untimed)
    #[arg(long, default_value_t = 20_000)]
    pub(crate) messages: usize,
    /// Repetitions; medians are reported
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Drain concurrency
    #[arg(long, default_value_t = 8)]
    pub(crate) concurrency: usize,
    /// Only this claim strategy (default: both)
    #[arg(long = "only-claim")]
    pub(crate) only_claim: Option<String>,
    /// Also drain with this many more messages queued behind the measured ones (for
    /// example 1000000), and show the claim's plan at that depth
    #[arg(long, default_value_t = 0)]
    pub(crate) depth: usize,
    /// Worker process counts for the drain with the worker in other processes (each
    /// with --concurrency handler slots); 0 to skip it
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) processes: Vec<usize>,
    /// Rows of other queues published into the store before the drains in other
    /// processes (for example 200000), which the claims must step past
    #[arg(long, default_value_t = 0)]
    pub(crate) backlog: usize,
    /// Reserver counts for the optimistic claim's contention measurement (PostgreSQL)
    #[arg(long, value_delimiter = ',', default_value = "8,32")]
    pub(crate) reservers: Vec<usize>,
    /// Also measure bare SQL (PostgreSQL, MySQL, SQLite) or bare lapin (RabbitMQ) on the
    /// same server or file in each run (its batched inserts taking turns with the queue's
    /// batched publish, of the same rows), with the pickup of a bare consumer (LISTEN and
    /// one claim, a lapin consumer), and report the queue's figures as ratios to it
    #[arg(long = "baseline", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) baseline: bool,
}
