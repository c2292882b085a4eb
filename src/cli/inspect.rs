//! `tally key`, `tally query` and `tally state`: reading what tally keeps in Redis.

use std::sync::Arc;

use tally::config::{Config, Model};

use super::args::{KeyArgs, StateAction, StateArgs};

/// `tally key` (`fetch` false) and `tally query` (`fetch` true).
pub(crate) async fn key(model: Arc<Model>, args: KeyArgs, fetch: bool) -> anyhow::Result<()> {
    let client = tally::app::request_client(&model)?;
    let query = tally::api::query::Query::new(model, client);
    let counter = query.counter_named(args.counter.clone())?;
    let at = tally::api::query::parse_time(args.at.as_deref())?;
    let dims: std::collections::BTreeMap<String, String> = args.dims.into_iter().collect();
    if fetch && (args.last.is_some() || args.from.is_some() || args.json) {
        use tally::api::query::{parse_time, Span};
        let span = match (args.last, &args.from, &args.to) {
            (Some(n), _, _) => Span::Last(n),
            (None, Some(a), Some(b)) => Span::Between(parse_time(Some(a))?, parse_time(Some(b))?),
            _ => Span::At(at),
        };
        let now = chrono::Utc::now().timestamp_millis();
        let answer = query.range(&counter, &[dims], span, now).await?.remove(0);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
            return Ok(());
        }
        println!("window_start\twindow_end\tvalue\tkey");
        for w in &answer.windows {
            let value = w.value.map_or("-".to_string(), |v| v.to_string());
            println!("{}\t{}\t{value}\t{}", w.start_ms, w.end_ms, w.key);
        }
        let total = answer.value.map_or("-".to_string(), |v| v.to_string());
        println!("combined\t\t{total}");
        for (member, score) in answer.top.iter().flatten() {
            println!("  {member}\t{score}");
        }
        for note in &answer.notes {
            println!("note: {note}");
        }
        return Ok(());
    }
    if fetch {
        let answer = query.fetch(&counter, &dims, at).await?;
        let value = answer.value.map_or("(none)".to_string(), |v| v.to_string());
        let field = answer.field.map(|f| format!(" {f}")).unwrap_or_default();
        println!("{}{field}\t{value}", answer.key);
        for (member, score) in answer.top.unwrap_or_default() {
            println!("  {member}\t{score}");
        }
    } else {
        let answer = query.key(&counter, &dims, at)?;
        let field = answer.field.map(|f| format!(" {f}")).unwrap_or_default();
        println!("{}{field}", answer.key);
    }
    Ok(())
}

pub(crate) async fn state(config: Config, args: StateArgs) -> anyhow::Result<()> {
    if let Some(StateAction::Repair {
        topic_name,
        partition,
        offset,
    }) = args.action
    {
        let topic = topic_name.as_deref();
        for (shard, value) in
            tally::stream::state::repair(&config, topic, partition, offset).await?
        {
            println!("partition {partition} shard {shard}: applied offset set to {value}");
        }
        return Ok(());
    }
    let rows = tally::stream::state::inspect(&config, &args.partitions).await?;
    println!("topic\tpartition\tshard\tapplied\tmarker_copy\tstatus");
    for r in rows {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            r.topic,
            r.partition,
            r.shard,
            r.fence.as_deref().unwrap_or("-"),
            r.marker_copy.as_deref().unwrap_or("-"),
            r.status()
        );
    }
    Ok(())
}
