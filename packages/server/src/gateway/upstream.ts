import http from 'node:http';
import https from 'node:https';
import type { ResolvedGateway } from './config.js';

/**
 * The connections to each gateway's upstream: one keep-alive pool per gateway, so a request
 * does not pay a TCP (and TLS) handshake, and sockets are taken last-in first-out (the warm
 * ones). Node's own `http.request` rather than `fetch`: it pipes bytes as they come, with no
 * web-stream layer between the two sockets (measured with `npm run bench:gateway`).
 */
export class UpstreamPools {
  readonly #agents = new Map<string, http.Agent>();

  agentOf(gateway: ResolvedGateway): http.Agent {
    let agent = this.#agents.get(gateway.name);
    if (!agent) {
      const options = { keepAlive: true, scheduling: 'lifo' as const, keepAliveMsecs: 1_000 };
      agent = gateway.upstream.protocol === 'https:' ? new https.Agent(options) : new http.Agent(options);
      this.#agents.set(gateway.name, agent);
    }
    return agent;
  }

  /** Starts one upstream request; the caller ends it with the body. */
  request(gateway: ResolvedGateway, method: string, path: string, headers: http.OutgoingHttpHeaders) {
    const { protocol, hostname, port } = gateway.upstream;
    const send = protocol === 'https:' ? https.request : http.request;
    return send({
      protocol,
      hostname,
      port,
      method,
      path,
      headers,
      agent: this.agentOf(gateway),
      // The path is used as it is: it was checked (path.ts) and joined as text, never resolved.
      setHost: false,
    });
  }

  close(): void {
    for (const agent of this.#agents.values()) agent.destroy();
    this.#agents.clear();
  }
}
