/**
 * Run callbacks: the destination check at run creation (SSRF), Standard Webhooks signing, and
 * the dispatcher that drains the `callback_deliveries` outbox (sql/010_callback_outbox.sql).
 */
export { checkCallbackUrl, maxCallbackUrlLength } from './destination.js';
export type {
  CallbackUrlCheck,
  CallbackUrlOptions,
  CallbackUrlRule,
  ResolvedAddress,
  Resolver,
} from './destination.js';
export { CallbackDispatcher } from './dispatcher.js';
export { dispatcherDefaults } from './options.js';
export type { CallbackDispatcherOptions, DispatcherEvent } from './options.js';
export { generateSigningSecret, signWebhook, tenantSigningSecret, verifyWebhook } from './signing.js';
export type { VerifyOptions, WebhookHeaders, WebhookVerification } from './signing.js';
