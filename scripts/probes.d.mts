import type pg from 'pg';

/** A free port on 127.0.0.1 (free when asked: take it at once). */
export function freePort(): Promise<number>;
/** Whether a PostgreSQL (or a pooler in front of one) at `config` answers `SELECT 1`. */
export function postgresAnswers(config: string | pg.ClientConfig, timeoutMs?: number): Promise<boolean>;
