import { describe, expect, it } from 'vitest';
import { SettingsError, resolveSettings } from '../../src/settings.js';

describe('websocket settings', () => {
  it('default to 1,000 connections and 10 per user; the websocket block sets them, the environment overrides it', () => {
    expect(resolveSettings({}, {})).toMatchObject({ wsMaxConnections: 1_000, wsMaxConnectionsPerUser: 10 });
    expect(resolveSettings({}, {}, {}, { maxConnections: 50, maxConnectionsPerUser: null })).toMatchObject({
      wsMaxConnections: 50,
      wsMaxConnectionsPerUser: 0,
    });
    const env = { SLUICE_WS_MAX_CONNECTIONS: '7', SLUICE_WS_MAX_CONNECTIONS_PER_USER: '3' };
    expect(resolveSettings({}, env, {}, { maxConnections: 50 })).toMatchObject({
      wsMaxConnections: 7,
      wsMaxConnectionsPerUser: 3,
    });
  });

  it('a bad value stops the start naming the variable, the config key, the range and the value', () => {
    expect(() => resolveSettings({}, { SLUICE_WS_MAX_CONNECTIONS: '0' })).toThrow(
      new SettingsError(
        'SLUICE_WS_MAX_CONNECTIONS',
        '0',
        'Expected SLUICE_WS_MAX_CONNECTIONS (websocket.maxConnections) to be a whole number from 1 to 1000000, got `0`',
      ),
    );
    expect(() => resolveSettings({}, {}, {}, { maxConnectionsPerUser: 2.5 })).toThrow(
      'Expected SLUICE_WS_MAX_CONNECTIONS_PER_USER (websocket.maxConnectionsPerUser) to be a whole number from 0 to 1000000, got `2.5`',
    );
    expect(() => resolveSettings({}, {}, {}, { maxConections: 5 } as never)).toThrow(
      '`websocket.maxConections` names no setting; the websocket block takes maxConnections, maxConnectionsPerUser',
    );
  });
});
