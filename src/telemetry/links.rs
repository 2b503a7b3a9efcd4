//! The last reconcile span of each Microservice in each cluster this
//! replica leads, so that a WaitForRollout span can link to the reconciles
//! it waited on. Only spans this process made are known here.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use opentelemetry::trace::SpanContext;

/// (cluster, namespace, name)
type Key = (String, String, String);

/// Enough for every object of a large fleet; past it, start over rather than grow.
const CAPACITY: usize = 100_000;

static LAST_RECONCILE: LazyLock<Mutex<HashMap<Key, SpanContext>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

pub fn record(cluster: &str, namespace: &str, name: &str, span: SpanContext) {
    if !span.is_valid() {
        return;
    }
    let mut map = LAST_RECONCILE.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= CAPACITY {
        map.clear();
    }
    map.insert((cluster.into(), namespace.into(), name.into()), span);
}

pub fn last(cluster: &str, namespace: &str, name: &str) -> Option<SpanContext> {
    let map = LAST_RECONCILE.lock().unwrap_or_else(|e| e.into_inner());
    map.get(&(cluster.into(), namespace.into(), name.into()))
        .cloned()
}

/// Carries a fleet write's span to the member's reconcile, across
/// processes: the fleet controller stamps it on the Microservice it writes,
/// and the member's leader links its reconcile span to it.
pub const TRACEPARENT_ANNOTATION: &str = "platform.example.io/rollout-traceparent";

/// The W3C `traceparent` of `span`, when it is being traced.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.remove("traceparent")
}

/// The span a `traceparent` names, if it parses.
pub fn from_traceparent(value: &str) -> Option<SpanContext> {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::TraceContextExt;
    let carrier = HashMap::from([("traceparent".to_string(), value.to_string())]);
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_and_garbage_is_none() {
        let tp = "00-6bf92f3577b34da6a3ce929d0e0e4738-00f067aa0ba902b7-01";
        let sc = from_traceparent(tp).expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "6bf92f3577b34da6a3ce929d0e0e4738"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            assert!(from_traceparent(bad).is_none(), "{bad:?}");
        }
    }
}
