# Sluice run server. Build: docker build -t sluice .   Run: see docs/deploy.md.

# --- build: every dependency, then the TypeScript build of the workspace packages -------------
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json tsconfig.base.json tsconfig.build.json ./
COPY packages ./packages
RUN npm ci --no-audit --no-fund
RUN npm run build

# --- runtime: production dependencies, the built packages and their SQL, as a non-root user -------
FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
# The manifests first, so the dependency layer is reused while only code changes.
COPY package.json package-lock.json ./
COPY packages/sluice/package.json packages/sluice/
COPY packages/postgres/package.json packages/postgres/
COPY packages/server/package.json packages/server/
COPY packages/testkit/package.json packages/testkit/
COPY packages/client/package.json packages/client/
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/packages/sluice/dist packages/sluice/dist
COPY --from=build /app/packages/postgres/dist packages/postgres/dist
COPY --from=build /app/packages/postgres/sql packages/postgres/sql
COPY --from=build /app/packages/server/dist packages/server/dist
COPY --from=build /app/packages/server/sql packages/server/sql
# The dashboard's page, script and stylesheet: read at start, the server does not start without them.
COPY --from=build /app/packages/server/static packages/server/static
COPY --from=build /app/packages/testkit/dist packages/testkit/dist
COPY --from=build /app/packages/client/dist packages/client/dist
# The embedded database (used only without DATABASE_URL) lives in /app/.sluice.
RUN mkdir -p /app/.sluice && chown node:node /app/.sluice
# The node image's unprivileged user, by number, so a cluster can tell it is not root.
USER 1000:1000
EXPOSE 8787
# Ready: taking work and reaching the database (the route load balancers use too).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:8787/readyz').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# The built CLI directly: the bin wrapper runs TypeScript sources when it is not under node_modules.
# A config module is read from /app/sluice.config.mjs (or .js) when one is mounted there.
CMD ["node", "packages/server/dist/cli.js", "serve", "--host", "0.0.0.0", "--port", "8787"]
