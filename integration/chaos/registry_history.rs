//! The registry's own record (#67): etcd's revision now, and every write
//! of the zone's records since a revision, read back by a watch from that
//! revision (the test bed's etcd never compacts), with the records each
//! wrote. What `check::no_orphan_record` judges.

use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};

use crate::check::{DnsChange, RecordPut, ZoneRecord};

async fn connect() -> Result<Client, String> {
    let endpoint = crate::support::registry::config().endpoints[0].clone();
    tokio::time::timeout(Duration::from_secs(5), Client::connect([endpoint], None))
        .await
        .map_err(|_| "connecting to the registry's etcd timed out".to_string())?
        .map_err(|e| format!("connecting to the registry's etcd: {e}"))
}

/// The zone's key prefix, as the product writes it.
pub async fn prefix() -> Result<String, String> {
    match crate::support::registry::registration().await {
        flotilla::registry::Registration::Ready(r) => Ok(format!("{}/", r.zone().prefix)),
        other => Err(format!("the registry config: {other:?}")),
    }
}

/// etcd's revision now.
pub async fn revision() -> Result<i64, String> {
    let mut c = connect().await?;
    let got = tokio::time::timeout(Duration::from_secs(5), c.get("/", None))
        .await
        .map_err(|_| "reading etcd's revision timed out".to_string())?
        .map_err(|e| format!("reading etcd's revision: {e}"))?;
    got.header()
        .map(|h| h.revision())
        .ok_or_else(|| "etcd sent no header".into())
}

/// etcd's revision now, asked up to `tries` times a second apart (etcd may
/// be stopped by the nemesis).
pub async fn revision_retrying(tries: usize) -> Result<i64, String> {
    let mut last = String::new();
    for _ in 0..tries {
        match revision().await {
            Ok(r) => return Ok(r),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(last)
}

/// Appends etcd's revision to `into` every `every`, each stamped with the
/// moment its read was sent (the revision holds every write before then),
/// until the task is aborted. Reads that fail (the registry stopped) are
/// skipped.
pub async fn sample_revisions(
    every: Duration,
    into: std::sync::Arc<std::sync::Mutex<Vec<crate::withdrawn::Sample>>>,
) {
    let mut client: Option<Client> = None;
    loop {
        if client.is_none() {
            client = connect().await.ok();
        }
        if let Some(c) = client.as_mut() {
            let at = jiff::Timestamp::now();
            match tokio::time::timeout(Duration::from_secs(2), c.get("/", None)).await {
                Ok(Ok(got)) => {
                    if let Some(h) = got.header() {
                        let revision = h.revision();
                        into.lock()
                            .unwrap()
                            .push(crate::withdrawn::Sample { at, revision });
                    }
                }
                _ => client = None,
            }
        }
        tokio::time::sleep(every).await;
    }
}

fn put(key: &[u8], value: &[u8], revision: i64) -> RecordPut {
    let record: Option<flotilla::registry::records::Record> = serde_json::from_slice(value).ok();
    RecordPut {
        key: String::from_utf8_lossy(key).into_owned(),
        uid: record.as_ref().map(|r| r.uid.clone()).unwrap_or_default(),
        parsed: record.is_some(),
        revision,
    }
}

/// The test bed's own key in the zone (`integration/fleet registry up`
/// writes it to see CoreDNS serve): not a record, and not judged.
fn test_bed_key(key: &[u8]) -> bool {
    key.ends_with(b"/registry-ready")
}

/// One event of etcd's history: a put (with its value) or a delete.
#[derive(Debug, Clone)]
pub struct Event {
    pub key: String,
    pub value: Vec<u8>,
    pub revision: i64,
    pub put: bool,
}

/// Every event under `prefix` after `since`, up to the revision now: the
/// watch replays them at once, so a pause of 5 s with none is the end
/// (the revision now may be another key's, outside the prefix).
pub async fn events_since(prefix: &str, since: i64) -> Result<Vec<Event>, String> {
    let now = revision().await?;
    let mut c = connect().await?;
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(since + 1);
    let mut stream = c
        .watch(prefix, Some(options))
        .await
        .map_err(|e| format!("watching the registry's history: {e}"))?;
    let mut out = Vec::new();
    let mut seen = since;
    while seen < now {
        let message = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
        let response = match message {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return Err("the history watch ended early".into()),
            Ok(Err(e)) => return Err(format!("the history watch failed: {e}")),
            // Nothing more under the prefix up to now: every event is in.
            Err(_) => break,
        };
        if response.compact_revision() > 0 {
            return Err(format!(
                "etcd compacted the history to {}",
                response.compact_revision()
            ));
        }
        for e in response.events() {
            let Some(kv) = e.kv() else { continue };
            seen = seen.max(kv.mod_revision());
            if test_bed_key(kv.key()) {
                continue;
            }
            out.push(Event {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                revision: kv.mod_revision(),
                put: e.event_type() == EventType::Put,
            });
        }
    }
    Ok(out)
}

/// Every record put under `prefix` after `since`.
pub async fn puts_since(prefix: &str, since: i64) -> Result<Vec<RecordPut>, String> {
    Ok(events_since(prefix, since)
        .await?
        .into_iter()
        .filter(|e| e.put)
        .map(|e| put(e.key.as_bytes(), &e.value, e.revision))
        .collect())
}

/// The fleet DNS writer's record puts among `events` (its records name
/// `@fleet` as writer), with the term each carries; values that do not
/// parse are skipped here, since `puts_since`'s check already counts them.
pub fn fleet_dns_puts(events: &[Event], fleet: &str) -> Vec<crate::check::DnsPut> {
    let writer = format!("{}{fleet}", flotilla::registry::records::FLEET_WRITER);
    events
        .iter()
        .filter(|e| e.put)
        .filter_map(|e| {
            let r: flotilla::registry::records::Record = serde_json::from_slice(&e.value).ok()?;
            (r.writer.cluster == writer).then(|| crate::check::DnsPut {
                key: e.key.clone(),
                revision: e.revision,
                epoch: r.writer.epoch,
            })
        })
        .collect()
}

/// The fleet DNS writer's term key: the term it held just after `since`
/// (read at that revision), then every claim after it. A value without
/// an epoch is an error: the fence cannot be judged without it.
pub async fn terms_since(key: &str, since: i64) -> Result<Vec<crate::check::TermPut>, String> {
    let epoch = |value: &[u8], revision: i64| -> Result<crate::check::TermPut, String> {
        let v: serde_json::Value = serde_json::from_slice(value)
            .map_err(|e| format!("the term key at revision {revision}: {e}"))?;
        let epoch = v["epoch"]
            .as_i64()
            .ok_or_else(|| format!("the term key at revision {revision} has no epoch: {v}"))?;
        Ok(crate::check::TermPut { revision, epoch })
    };
    let mut c = connect().await?;
    let before = c
        .get(key, Some(GetOptions::new().with_revision(since)))
        .await
        .map_err(|e| format!("reading the term key at {since}: {e}"))?;
    let mut out = Vec::new();
    if let Some(kv) = before.kvs().first() {
        out.push(epoch(kv.value(), kv.mod_revision())?);
    }
    for e in events_since(key, since)
        .await?
        .into_iter()
        .filter(|e| e.put)
    {
        out.push(epoch(&e.value, e.revision)?);
    }
    Ok(out)
}

/// Every record under `prefix` now.
pub async fn present(prefix: &str) -> Result<Vec<RecordPut>, String> {
    let mut c = connect().await?;
    let got = c
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| format!("reading the registry: {e}"))?;
    Ok(got
        .kvs()
        .iter()
        .filter(|kv| !test_bed_key(kv.key()))
        .map(|kv| put(kv.key(), kv.value(), kv.mod_revision()))
        .collect())
}

/// The zone's records present at `revision`, as (key, record), and every
/// change among `events`: whose object each record stands for, and whether
/// `fleet`'s DNS writer put it. A value that does not parse is an error.
pub async fn fleet_dns_changes(
    prefix: &str,
    fleet: &str,
    revision: i64,
    events: &[Event],
) -> Result<(Vec<(String, ZoneRecord)>, Vec<DnsChange>), String> {
    use flotilla::registry::records::{FLEET_WRITER, Record};
    let writer = format!("{FLEET_WRITER}{fleet}");
    let read = |key: &str, value: &[u8]| -> Result<ZoneRecord, String> {
        let r: Record =
            serde_json::from_slice(value).map_err(|e| format!("the record at {key}: {e}"))?;
        Ok(ZoneRecord {
            fleet: r.writer.cluster == writer,
            object: r.object,
            fail_open: r.fail_open,
        })
    };
    let mut c = connect().await?;
    let before = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_revision(revision)),
        )
        .await
        .map_err(|e| format!("reading the registry at {revision}: {e}"))?;
    let mut initial = Vec::new();
    for kv in before.kvs().iter().filter(|kv| !test_bed_key(kv.key())) {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let record = read(&key, kv.value())?;
        initial.push((key, record));
    }
    let mut changes = Vec::new();
    for e in events {
        changes.push(DnsChange {
            key: e.key.clone(),
            revision: e.revision,
            put: match e.put {
                true => Some(read(&e.key, &e.value)?),
                false => None,
            },
        });
    }
    Ok((initial, changes))
}
