import { describeBenchesEnd } from './benches-end.js';

describeBenchesEnd(['stream', 'server']);
