import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import { createAgent } from 'sluice';
import { defineConfig, resolveSettings, type RunningServer } from '@sluice/server';
import { startTestServer } from '../helpers.js';

// Docker does not run here: the deploy files are parsed and held against the code they deploy
// (its CLI, its routes, its settings) and against each other.

const root = fileURLToPath(new URL('../../../../', import.meta.url));
const read = (path: string) => readFileSync(join(root, path), 'utf8');
/* eslint-disable @typescript-eslint/no-explicit-any -- manifests are checked field by field */
type Doc = Record<string, any>;

interface Instruction {
  readonly keyword: string;
  readonly args: string;
}

/** A Dockerfile's instructions by stage: continuation lines joined, comments dropped. */
function dockerStages(text: string): { from: string; name?: string; steps: Instruction[] }[] {
  const lines = text.replace(/\\\n/g, ' ').split('\n');
  const stages: { from: string; name?: string; steps: Instruction[] }[] = [];
  for (const raw of lines) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const [keyword, ...rest] = line.split(/\s+/);
    const step = { keyword: keyword!.toUpperCase(), args: rest.join(' ') };
    if (step.keyword === 'FROM') {
      const [image, as, name] = rest;
      stages.push({ from: image!, name: as?.toUpperCase() === 'AS' ? name : undefined, steps: [] });
    } else stages.at(-1)!.steps.push(step);
  }
  return stages;
}

/** The CLI's subcommands, as its `main` dispatches them. */
const cliCommands = [...read('packages/server/src/cli.ts').matchAll(/command === '([a-z-]+)'/g)].map(
  (m) => m[1],
);

/** What a command line runs: `node <script> <subcommand> ...` with the script and flags. */
function checkCommand(argv: readonly string[]): { subcommand: string; port: string | undefined } {
  expect(argv[0]).toBe('node');
  const script = argv[1]!;
  // The built CLI comes from src/cli.ts; the test cannot see dist/, so it checks the source.
  expect(script).toBe('packages/server/dist/cli.js');
  expect(existsSync(join(root, script.replace('/dist/', '/src/').replace(/\.js$/, '.ts')))).toBe(true);
  const subcommand = argv[2]!;
  expect(cliCommands).toContain(subcommand);
  const flag = (name: string) => (argv.includes(name) ? argv[argv.indexOf(name) + 1] : undefined);
  // Listening on every interface: the default 127.0.0.1 is unreachable from outside a container.
  expect(flag('--host')).toBe('0.0.0.0');
  return { subcommand, port: flag('--port') };
}

/** The path a healthcheck command fetches, e.g. /readyz. */
const fetchedPath = (command: string) => /http:\/\/127\.0\.0\.1:\d+(\/[a-z/]*)/.exec(command)?.[1];

const drainMsOf = (value: string | undefined) =>
  resolveSettings(undefined, value === undefined ? {} : { AGENT_RUN_DRAIN_TIMEOUT_MS: value }).drainTimeoutMs;

// One server for the file (started in beforeAll, the harness closes it after the last test).
let server: RunningServer;
beforeAll(async () => {
  const model = {
    api: 'openai-completions' as const,
    provider: 'none',
    id: 'm',
    baseUrl: 'http://127.0.0.1:9',
  };
  ({ server } = await startTestServer({
    config: defineConfig({ agents: { idle: createAgent({ model, credentials: { apiKey: 'k' } }) } }),
  }));
}, 120_000);
/** Each path a probe names must be a route the server answers 200 on when it is ready. */
async function expectRoute(path: string | undefined): Promise<void> {
  expect(path).toMatch(/^\//);
  const response = await fetch(`${server.url}${path}`);
  expect(response.status, `GET ${path}`).toBe(200);
}

describe('the deploy files', () => {
  it('Dockerfile: a build stage with npm ci and the build, a runtime stage with production dependencies, a non-root user, a healthcheck on /readyz and `serve` on the exposed port', async () => {
    const stages = dockerStages(read('Dockerfile'));
    expect(stages.length).toBeGreaterThanOrEqual(2);
    const [build, runtime] = [stages[0]!, stages.at(-1)!];
    const runs = (stage: typeof build) => stage.steps.filter((s) => s.keyword === 'RUN').map((s) => s.args);
    expect(runs(build).some((r) => /\bnpm ci\b/.test(r))).toBe(true);
    expect(runs(build).some((r) => /\bnpm run build\b/.test(r))).toBe(true);
    expect(runs(runtime).some((r) => /\bnpm ci\b.*--omit=dev/.test(r))).toBe(true);
    // Both stages on a Node that the packages' engines accept.
    for (const stage of stages) expect(stage.from).toMatch(/^node:(2[0-9])\b/);

    // What the runtime copies from the build exists there: each package's build output and SQL.
    for (const step of runtime.steps.filter(
      (s) => s.keyword === 'COPY' && s.args.startsWith(`--from=${build.name}`),
    )) {
      const source = step.args.split(/\s+/)[1]!.replace(/^\/app\//, '');
      if (source.endsWith('/dist'))
        expect(existsSync(join(root, source, '../tsconfig.build.json')), source).toBe(true);
      else expect(existsSync(join(root, source)), source).toBe(true);
    }
    // What a package ships beside its code (SQL, the dashboard's files) is read at run time from
    // next to dist/: each must reach the runtime, or the server fails at start in the image.
    const copied = runtime.steps
      .filter((s) => s.keyword === 'COPY' && s.args.startsWith(`--from=${build.name}`))
      .map((s) => s.args.split(/\s+/)[1]!.replace(/^\/app\//, ''));
    for (const name of readdirSync(join(root, 'packages'))) {
      const files = (JSON.parse(read(`packages/${name}/package.json`)) as { files?: string[] }).files ?? [];
      // Sources are not run in the image (CMD runs dist/cli.js), nor is the bin wrapper.
      for (const entry of files.filter((f) => !f.startsWith('!') && f !== 'src' && f !== 'bin'))
        expect(copied, `packages/${name}/${entry}`).toContain(`packages/${name}/${entry}`);
    }
    // npm ci needs every workspace's manifest: a package added later must be copied too.
    const manifests = runtime.steps
      .filter((s) => s.keyword === 'COPY' && /package\.json/.test(s.args) && !s.args.startsWith('--from'))
      .map((s) => s.args.split(/\s+/)[0]);
    for (const name of readdirSync(join(root, 'packages')))
      expect(manifests).toContain(`packages/${name}/package.json`);

    // Non-root from before the command on.
    const keywords = runtime.steps.map((s) => s.keyword);
    const user = runtime.steps.findLast((s) => s.keyword === 'USER')?.args;
    expect(user).toBeDefined();
    expect(['root', '0']).not.toContain(user!.split(':')[0]);
    expect(keywords.lastIndexOf('USER')).toBeLessThan(keywords.lastIndexOf('CMD'));

    const cmd = JSON.parse(runtime.steps.find((s) => s.keyword === 'CMD')!.args) as string[];
    const { subcommand, port } = checkCommand(cmd);
    expect(subcommand).toBe('serve');
    expect(runtime.steps.find((s) => s.keyword === 'EXPOSE')?.args).toBe(port);
    const healthcheck = runtime.steps.find((s) => s.keyword === 'HEALTHCHECK')!.args;
    expect(healthcheck).toContain(`127.0.0.1:${port}/`);
    await expectRoute(fetchedPath(healthcheck));

    // The context leaves out what the image builds itself, and keeps what it copies.
    const ignored = read('.dockerignore')
      .split('\n')
      .filter((l) => l && !l.startsWith('#'));
    expect(ignored).toEqual(expect.arrayContaining(['**/node_modules', '**/dist', '.git']));
    for (const kept of [
      'packages',
      'package.json',
      'package-lock.json',
      'tsconfig.base.json',
      'packages/server/src',
    ])
      expect(ignored).not.toContain(kept);
  });

  it('compose.yaml: PostgreSQL, Redis and two servers on them (Redis cache store), healthy before the proxy, behind one published port', async () => {
    const compose = parseYaml(read('compose.yaml'), { merge: true }) as Doc;
    const services = compose.services as Record<string, Doc>;
    const servers = Object.entries(services).filter(([, s]) => Array.isArray(s.command));
    expect(servers.map(([name]) => name)).toHaveLength(2);
    const [[, first], [, second]] = servers as [[string, Doc], [string, Doc]];
    for (const [, s] of servers) {
      const { subcommand, port } = checkCommand(s.command as string[]);
      expect(subcommand).toBe('serve');
      expect(port).toBe('8787');
      expect(s.environment.SLUICE_CACHE_STORE).toBe('redis');
      expect(s.environment.DATABASE_URL).toMatch(/^postgres:\/\/[^@]+@postgres:5432\//);
      expect(s.environment.REDIS_URL).toMatch(/^redis:\/\/redis:6379/);
      expect(s.depends_on).toEqual({
        postgres: { condition: 'service_healthy' },
        redis: { condition: 'service_healthy' },
      });
      await expectRoute(fetchedPath((s.healthcheck.test as string[]).join(' ')));
      // Docker's stop waits longer than the server's drain.
      const graceSeconds = Number(/^(\d+)s$/.exec(s.stop_grace_period)?.[1]);
      expect(graceSeconds * 1000).toBeGreaterThan(drainMsOf(s.environment.AGENT_RUN_DRAIN_TIMEOUT_MS));
    }
    // One database and one Redis for both.
    expect(second.environment).toEqual(first.environment);
    expect(services.postgres?.image).toMatch(/^postgres:/);
    expect(services.redis?.image).toMatch(/^redis:/);
    expect(services.postgres?.healthcheck).toBeDefined();
    expect(services.redis?.healthcheck).toBeDefined();

    const published = Object.entries(services).filter(([, s]) => s.ports);
    expect(published.map(([name]) => name)).toEqual(['proxy']);
    expect(published[0]![1].ports).toHaveLength(1);
    const proxy = services.proxy!;
    expect(Object.keys(proxy.depends_on).sort()).toEqual(servers.map(([name]) => name).sort());
    for (const dep of Object.values(proxy.depends_on as Record<string, Doc>))
      expect(dep.condition).toBe('service_healthy');
    // The proxy balances over both servers, on the port they listen on and the one it publishes.
    const mount = (proxy.volumes as string[]).find((v) => v.endsWith('/etc/nginx/conf.d/default.conf:ro'))!;
    const nginx = read(mount.split(':')[0]!.replace(/^\.\//, ''));
    for (const [name] of servers) expect(nginx).toMatch(new RegExp(`server ${name}:8787\\b`));
    expect(nginx).toContain(`listen ${String(published[0]![1].ports[0]).split(':')[1]};`);
  });

  it('Kubernetes: readiness on /readyz, a liveness check, a grace period above drain + preStop, non-root, resources, a Service and DATABASE_URL from a Secret', async () => {
    const docs = readdirSync(join(root, 'deploy/k8s'))
      .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
      .flatMap((f) => parseAllDocuments(read(`deploy/k8s/${f}`)).map((d) => d.toJS() as Doc));
    const kustomization = parseYaml(read('deploy/k8s/kustomization.yaml')) as Doc;
    expect((kustomization.resources as string[]).sort()).toEqual(
      readdirSync(join(root, 'deploy/k8s'))
        .filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml')
        .sort(),
    );
    const one = (kind: string) => {
      const found = docs.filter((d) => d.kind === kind);
      expect(found, kind).toHaveLength(1);
      return found[0]!;
    };
    const deployment = one('Deployment');
    const service = one('Service');
    const secret = one('Secret');
    const pod = deployment.spec.template.spec;
    const [container] = pod.containers as Doc[];
    const env = Object.fromEntries((container!.env as Doc[]).map((e) => [e.name, e]));
    const portNames = (container!.ports as Doc[]).map((p) => p.name);

    const { subcommand, port } = checkCommand(container!.args as string[]);
    expect(subcommand).toBe('serve');
    expect((container!.ports as Doc[]).map((p) => String(p.containerPort))).toContain(port);

    expect(container!.readinessProbe.httpGet.path).toBe('/readyz');
    expect(portNames).toContain(container!.readinessProbe.httpGet.port);
    await expectRoute(container!.readinessProbe.httpGet.path);
    // routes/ops.ts has no liveness route, so liveness is the socket itself.
    const liveness = container!.livenessProbe;
    if (liveness.httpGet) await expectRoute(liveness.httpGet.path);
    else expect(portNames).toContain(liveness.tcpSocket.port);
    if (container!.startupProbe?.httpGet) await expectRoute(container!.startupProbe.httpGet.path);

    // SIGTERM comes after preStop, and the drain must end before the grace period does.
    const preStop = container!.lifecycle.preStop.exec.command as string[];
    expect(preStop[0]).toBe('sleep');
    const preStopSeconds = Number(preStop[1]);
    expect(preStopSeconds).toBeGreaterThan(0);
    const drainSeconds = drainMsOf(env.AGENT_RUN_DRAIN_TIMEOUT_MS?.value) / 1000;
    expect(pod.terminationGracePeriodSeconds).toBeGreaterThan(drainSeconds + preStopSeconds);

    expect(pod.securityContext.runAsNonRoot).toBe(true);
    expect(pod.securityContext.runAsUser).toBeGreaterThan(0);
    expect(container!.securityContext.allowPrivilegeEscalation).toBe(false);
    expect(container!.resources.requests).toEqual({ cpu: expect.any(String), memory: expect.any(String) });
    expect(container!.resources.limits.memory).toEqual(expect.any(String));

    // DATABASE_URL from the Secret, under a key the Secret has.
    const ref = env.DATABASE_URL.valueFrom.secretKeyRef;
    expect(ref.name).toBe(secret.metadata.name);
    expect(Object.keys(secret.stringData ?? secret.data)).toContain(ref.key);
    expect(env.DATABASE_URL.value).toBeUndefined();
    expect(env.SLUICE_CACHE_STORE?.value).toBe('redis');

    // The Service reaches the Deployment's pods on their named port.
    expect(deployment.spec.selector.matchLabels).toEqual(service.spec.selector);
    expect(deployment.spec.template.metadata.labels).toMatchObject(service.spec.selector);
    for (const p of service.spec.ports as Doc[]) expect(portNames).toContain(p.targetPort);
  });
});
