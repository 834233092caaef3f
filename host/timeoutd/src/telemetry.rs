//! Optional trace export (`[tracing] otlp_endpoint`): the daemon's spans — one per trigger, per
//! HTTP request, per broker message — go to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf). A trace begun elsewhere continues here: an HTTP request's `traceparent` header
//! and a RocketMQ message's `traceparent` property (W3C Trace Context,
//! <https://www.w3.org/TR/trace-context/>) become the parent of the span that handles it.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TracingConfig;

/// How long one export to the collector may take: a collector that hangs costs the spans of one
/// batch, never the daemon's work (the exporter runs on its own thread).
pub const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long the flush at exit may take: a hung collector never holds up a SIGTERM's stop (5 s).
pub const FLUSH_AT_EXIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The exporter's provider: flushes what is buffered when dropped (at exit), for at most
/// [`FLUSH_AT_EXIT`].
pub struct Guard(SdkTracerProvider);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown_with_timeout(FLUSH_AT_EXIT) {
            eprintln!("timeoutd: flushing traces: {e}");
        }
    }
}

/// The tracing layer exporting spans to `config.otlp_endpoint`, with its guard.
///
/// # Errors
/// The exporter cannot be built (a malformed endpoint).
pub fn layer<S>(
    config: &TracingConfig,
) -> Result<(impl tracing_subscriber::Layer<S>, Guard), String>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(config.otlp_endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("tracing.otlp_endpoint {}: {e}", config.otlp_endpoint))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("timeoutd");
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Guard(provider),
    ))
}

/// Makes `span` continue the trace `traceparent` names (a W3C `traceparent` value); a missing or
/// malformed one leaves it a root.
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(parent);
}
