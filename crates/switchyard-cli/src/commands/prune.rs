//! `switchyard prune --older-than DUR`: deletes job results and dead letters that ended
//! longer ago than DUR. `work --prune-older-than DUR` stores the same as the hourly
//! schedule `switchyard.prune`.

use switchyard::{parse_duration, Config, Result};

use crate::cli::PruneArgs;

pub(crate) async fn run(config: &Config, args: PruneArgs, json: bool) -> Result<()> {
    let older_than = parse_duration("--older-than", &args.older_than)?;
    // Only a status store that already exists: the transport's own, or on RabbitMQ the
    // SQL store of DATABASE_URL when it can be opened without creating anything (a
    // store that does not exist has nothing to prune).
    let jobs = switchyard::connect_existing_jobs(config).await?;
    let (transport, store) = (jobs.transport().clone(), jobs.store().cloned());
    let (results, dead) =
        switchyard::schedule::prune(&transport, store.as_ref(), older_than).await?;
    if json {
        crate::output::json_line(&serde_json::json!({
            "results": results, "dead_letters": dead,
            "older_than_seconds": older_than.as_secs(),
        }))
    } else {
        outln!(
            "pruned {results} job result{} and {dead} dead letter{} older than {}",
            if results == 1 { "" } else { "s" },
            if dead == 1 { "" } else { "s" },
            args.older_than
        );
        Ok(())
    }
}
