import { describeBenchesEnd } from './benches-end.js';

describeBenchesEnd(['queues', 'cache', 'fairness']);
