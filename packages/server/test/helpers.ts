// The harness (./harness/) under the name the tests imported it by before it had a folder.
export * from './harness/index.js';
