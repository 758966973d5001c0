import { SpanStatusCode, trace } from '@opentelemetry/api';

/**
 * Traces of the server. The runtime (`sluice`) draws a run's turns, provider requests and tool
 * calls through `@opentelemetry/api` alone; this file adds the server's span around each run and
 * starts an SDK that exports them, only when an OTLP endpoint is configured. The SDK and its
 * exporters are imported on demand, so a server without the setting loads none of them.
 */

/** What a started SDK gives back: flush and stop, before the process exits. */
export interface Tracing {
  shutdown(): Promise<void>;
}

/**
 * Starts OpenTelemetry's Node SDK with its OTLP trace exporter when `OTEL_EXPORTER_OTLP_ENDPOINT`
 * (or the traces-only `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; resolves undefined otherwise.
 * The exporter follows the standard OTEL_* variables (protocol, headers, batch delay); metrics
 * and logs stay off (metrics are served at /metrics, logs go to stdout).
 */
export async function startTracing(env: NodeJS.ProcessEnv = process.env): Promise<Tracing | undefined> {
  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim() || env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  if (!endpoint) return undefined;
  const { NodeSDK } = await import('@opentelemetry/sdk-node');
  const sdk = new NodeSDK({
    // OTEL_SERVICE_NAME, when set, names the service through the SDK's own resource detection.
    serviceName: env.OTEL_SERVICE_NAME?.trim() ? undefined : 'sluice',
    instrumentations: [],
    metricReaders: [],
    logRecordProcessors: [],
  });
  sdk.start();
  return { shutdown: () => sdk.shutdown() };
}

const tracer = trace.getTracer('@sluice/server');

/** The server's identity of a run: what its span is named after (never its input). */
export interface TracedRun {
  readonly id: string;
  readonly agent: string;
  readonly class: string;
  readonly tenant: string;
}

/**
 * Runs `execute` inside the run's span, so the agent's own spans (its turns, requests and tool
 * calls) nest under it. The span records the outcome's status; `ended_elsewhere` when another
 * process ended the run (`execute` resolved undefined).
 */
export function traceRun<T extends { readonly status: string } | undefined>(
  run: TracedRun,
  execute: () => Promise<T>,
): Promise<T> {
  return tracer.startActiveSpan(
    'sluice.run',
    {
      attributes: {
        'sluice.run.id': run.id,
        'sluice.agent': run.agent,
        'sluice.run.class': run.class,
        'sluice.tenant': run.tenant,
      },
    },
    async (span) => {
      try {
        const outcome = await execute();
        span.setAttribute('sluice.run.status', outcome?.status ?? 'ended_elsewhere');
        if (outcome?.status === 'failed') span.setStatus({ code: SpanStatusCode.ERROR });
        return outcome;
      } catch (error) {
        span.setStatus({
          code: SpanStatusCode.ERROR,
          message: error instanceof Error ? error.name : 'error',
        });
        throw error;
      } finally {
        span.end();
      }
    },
  );
}
