//! Logs, traces and metrics. Traces go to an OTLP/gRPC collector when the
//! standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set,
//! and nowhere otherwise. `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`
//! and `OTEL_TRACES_SAMPLER` are honoured by the SDK.

pub mod events;
pub mod grpc_layer;
pub mod http;
pub mod kube_layer;
pub mod links;
pub mod metrics;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("metrics endpoint: {0}")]
    Http(String),
}

impl TelemetryError {
    pub fn category(&self) -> &'static str {
        match self {
            TelemetryError::Exporter(_) => "Exporter",
            TelemetryError::Http(_) => "Http",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Who this process is, on every span it exports.
pub struct Identity {
    pub replica_id: String,
    pub fleet_name: Option<String>,
}

/// Flushes spans when the process stops.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("warning: flushing spans: {e}");
        }
    }
}

fn otlp_configured() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

fn resource(who: &Identity) -> Resource {
    let mut attributes = vec![KeyValue::new("flotilla.replica.id", who.replica_id.clone())];
    if let Some(f) = &who.fleet_name {
        attributes.push(KeyValue::new("flotilla.fleet.name", f.clone()));
    }
    let builder = Resource::builder().with_attributes(attributes);
    // The SDK reads OTEL_SERVICE_NAME itself; name the service only when it is unset.
    if std::env::var("OTEL_SERVICE_NAME").is_ok() {
        builder.build()
    } else {
        builder.with_service_name("flotilla").build()
    }
}

/// Installs the global subscriber. Must run inside the Tokio runtime: the
/// OTLP exporter's gRPC client needs it.
pub fn init(format: LogFormat, who: &Identity) -> Result<Telemetry, TelemetryError> {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube=warn"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let provider = if otlp_configured() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource(who))
                .build(),
        )
    } else {
        None
    };
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("flotilla"))
            .with_filter(filter())
    });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter()))
        .with(otel)
        .init();
    Ok(Telemetry { provider })
}
