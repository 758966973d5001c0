/** What the bench tells each system's server process, and what it answers when ready. */
export interface SystemOptions {
  databaseUrl: string;
  /** The provider stand-in's OpenAI base URL. */
  providerUrl: string;
  tenants: string[];
  /** Queue workers of the process (model calls at once). */
  workers: number;
  /** Per-tenant running cap; 0 for none (the workers are the only bound). */
  tenantCap: number;
}

export interface SystemReady {
  /** Where the load generator POSTs one run. */
  url: string;
  /** The headers of each tenant's requests (Sluice: its token). */
  headers: Record<string, Record<string, string>>;
  /** The body of one request for a tenant; `%n` is replaced by the request's number. */
  bodies: Record<string, string>;
  /** The status an accepted run is answered with. */
  status: number;
}

/** The one user message of a run: the stand-in reads the tenant from its first word. */
export const inputOf = (tenant: string) => `${tenant} summarise this`;
