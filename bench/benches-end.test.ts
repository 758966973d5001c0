import { describeBenchesEnd } from './benches-end.js';

describeBenchesEnd(['postgres', 'memory', 'agent', 'limiter']);
