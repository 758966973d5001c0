/**
 * `@sluice/server`: the HTTP run server for Sluice agents.
 */
export { ConfigLoadError, defineConfig } from './config.js';
export type { SluiceConfig, TenantQuota } from './config.js';
export { createApp } from './app.js';
export type { ServerApp, AppOptions } from './app.js';
export { serve, loadConfig } from './server.js';
export { heapFlags, tuneHeap } from './heap-tuning.js';
export type { ServeOptions, RunningServer } from './server.js';
export { resolveSettings, settingDefaults, SettingsError } from './settings.js';
export type { RunsConfig, ServerSettings, WebsocketConfig } from './settings.js';
export { openStore } from './store/store.js';
export type { Store } from './store/store.js';
export { createToken, listTokens, revokeToken } from './store/tokens.js';
