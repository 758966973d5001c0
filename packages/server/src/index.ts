/**
 * `@sluice/server`: the HTTP run server for Sluice agents.
 */
export { defineConfig } from './config.js';
export type { SluiceConfig } from './config.js';
export { createApp } from './app.js';
export type { ServerApp } from './app.js';
export { serve, loadConfig } from './server.js';
export type { ServeOptions, RunningServer } from './server.js';
export { resolveSettings, settingDefaults } from './settings.js';
export type { ServerSettings } from './settings.js';
export { openStore } from './store/store.js';
export { createToken } from './store/tokens.js';
