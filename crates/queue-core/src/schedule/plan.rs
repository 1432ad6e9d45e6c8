//! Which slots a schedule fires now, from its cursor (the last slot it handled) and its
//! catch-up policy: a pure function of the clock, so that every worker that looks at
//! the same cursor at about the same time fires the same slots.

use std::time::Duration;

use super::cadence::Cadence;
use super::CatchUp;

/// The most slots a plan counts past its cursor: a per-second schedule down for a day
/// has 86,400; beyond this the count of missed slots stops growing.
const COUNT_CAP: u64 = 100_000;
/// The same for a cron pattern, whose slots are found one search at a time.
const CRON_COUNT_CAP: u64 = 10_000;

/// A slot is on time (for [`CatchUp::Skip`]) until its next slot is due, a minute at most.
const ON_TIME_AT_MOST: i64 = 60_000_000;

/// What a schedule does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The slots to fire, oldest first (µs).
    pub(crate) fire: Vec<i64>,
    /// The slots past the cursor that it does not fire.
    pub(crate) missed: u64,
    /// The cursor once these are fired: the latest slot at or before now.
    pub(crate) through: i64,
}

/// The plan at `now` of a schedule whose slots through `cursor` were handled.
pub(crate) fn plan(cadence: &Cadence, catch_up: &CatchUp, cursor: i64, now: i64) -> Plan {
    let nothing = Plan {
        fire: Vec::new(),
        missed: 0,
        through: cursor,
    };
    let Some(latest) = cadence.at_or_before(now).filter(|s| *s > cursor) else {
        return nothing;
    };
    let due = count_between(cadence, cursor, latest);
    let fire = match *catch_up {
        CatchUp::Skip => {
            let on_time = cadence
                .next_after(latest)
                .map_or(ON_TIME_AT_MOST, |next| (next - latest).min(ON_TIME_AT_MOST));
            if now - latest <= on_time {
                vec![latest]
            } else {
                Vec::new()
            }
        }
        CatchUp::Latest => vec![latest],
        CatchUp::All { max_runs, within } => {
            let window = i64::try_from(within.as_micros()).unwrap_or(i64::MAX);
            let oldest = now.saturating_sub(window);
            let mut fire = Vec::new();
            let mut slot = Some(latest);
            while let Some(s) = slot.filter(|s| *s > cursor && *s >= oldest) {
                if fire.len() >= max_runs as usize {
                    break;
                }
                fire.push(s);
                slot = cadence.before(s);
            }
            fire.reverse();
            fire
        }
    };
    Plan {
        missed: due.saturating_sub(fire.len() as u64),
        fire,
        through: latest,
    }
}

/// How many slots fall in (after, through], up to [`COUNT_CAP`] ([`CRON_COUNT_CAP`] for a
/// cron pattern).
fn count_between(cadence: &Cadence, after: i64, through: i64) -> u64 {
    if let Some(every) = cadence.interval() {
        let us = i64::try_from(every.as_micros()).unwrap_or(i64::MAX).max(1);
        let n = through.div_euclid(us) - after.div_euclid(us);
        return u64::try_from(n).unwrap_or(0).min(COUNT_CAP);
    }
    let mut n = 0;
    let mut t = after;
    while n < CRON_COUNT_CAP {
        match cadence.next_after(t) {
            Some(s) if s <= through => {
                n += 1;
                t = s;
            }
            _ => break,
        }
    }
    n
}

/// How long a slot's job keeps its unique key after it ran: past the longest time any
/// worker could still consider the slot (its plan looks back one slot gap for `latest`
/// and `skip`, the window for `all`), with an hour to spare.
pub(crate) fn key_hold(cadence: &Cadence, catch_up: &CatchUp, slot: i64) -> Duration {
    let gap = cadence
        .next_after(slot)
        .map_or(0, |next| u64::try_from(next - slot).unwrap_or(0));
    let window = match catch_up {
        CatchUp::All { within, .. } => *within,
        _ => Duration::ZERO,
    };
    Duration::from_micros(gap)
        .max(window)
        .saturating_add(Duration::from_secs(3600))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn per_second() -> Cadence {
        Cadence::every(Duration::from_secs(1)).expect("valid")
    }

    #[test]
    fn nothing_is_due_before_the_next_slot() {
        let p = plan(&per_second(), &CatchUp::Latest, 10 * S, 10 * S + S / 2);
        assert_eq!(p.fire, Vec::<i64>::new());
        assert_eq!(p.through, 10 * S);
    }

    #[test]
    fn after_a_ten_second_outage_each_policy_fires_its_share() {
        let c = per_second();
        let (cursor, now) = (100 * S, 110 * S + S / 2);
        let latest = plan(&c, &CatchUp::Latest, cursor, now);
        assert_eq!(
            (latest.fire, latest.missed, latest.through),
            (vec![110 * S], 9, 110 * S)
        );
        // The latest slot of a per-second schedule is on time: skip fires it too.
        let skip = plan(&c, &CatchUp::Skip, cursor, now);
        assert_eq!((skip.fire, skip.missed), (vec![110 * S], 9));
        let all = plan(
            &c,
            &CatchUp::All {
                max_runs: 100,
                within: Duration::from_secs(3600),
            },
            cursor,
            now,
        );
        assert_eq!(all.fire, (101..=110).map(|s| s * S).collect::<Vec<_>>());
        assert_eq!(all.missed, 0);
        let capped = plan(
            &c,
            &CatchUp::All {
                max_runs: 3,
                within: Duration::from_secs(5),
            },
            cursor,
            now,
        );
        assert_eq!(capped.fire, vec![108 * S, 109 * S, 110 * S]);
        assert_eq!(capped.missed, 7);
    }

    #[test]
    fn skip_drops_an_hourly_slot_late_by_more_than_a_minute() {
        let c = Cadence::every(Duration::from_secs(3600)).expect("valid");
        let hour = 3600 * S;
        let late = plan(&c, &CatchUp::Skip, 10 * hour, 11 * hour + 61 * S);
        assert_eq!(
            (late.fire, late.missed, late.through),
            (vec![], 1, 11 * hour)
        );
        let on_time = plan(&c, &CatchUp::Skip, 10 * hour, 11 * hour + 59 * S);
        assert_eq!(on_time.fire, vec![11 * hour]);
        let caught_up = plan(&c, &CatchUp::Latest, 10 * hour, 15 * hour + 61 * S);
        assert_eq!((caught_up.fire, caught_up.missed), (vec![15 * hour], 4));
    }

    #[test]
    fn a_key_outlives_every_look_back() {
        let hourly = Cadence::every(Duration::from_secs(3600)).expect("valid");
        assert_eq!(
            key_hold(&hourly, &CatchUp::Latest, 0),
            Duration::from_secs(7200)
        );
        let window = CatchUp::All {
            max_runs: 10,
            within: Duration::from_secs(86_400),
        };
        assert_eq!(
            key_hold(&per_second(), &window, 0),
            Duration::from_secs(86_400 + 3600)
        );
    }
}
