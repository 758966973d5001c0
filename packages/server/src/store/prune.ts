/** At most this many statements a prune pass: 500,000 rows at the default batch of 500. */
export const PRUNE_MAX_STATEMENTS = 1_000;

/**
 * One upkeep prune pass: runs `deleteBatch` (one statement deleting at most `batch` rows, which
 * answers how many went) again while it finds a full batch, at most `maxStatements` times. Each
 * statement stays short, and a pass keeps up with a table that gains more than one batch between
 * passes (one statement a pass would let it grow for ever). Returns how many rows went.
 */
export async function deleteInBatches(
  deleteBatch: () => Promise<number>,
  batch: number,
  maxStatements = PRUNE_MAX_STATEMENTS,
): Promise<number> {
  let total = 0;
  for (let statements = 0; statements < maxStatements; statements++) {
    const deleted = await deleteBatch();
    total += deleted;
    if (deleted < batch) break;
  }
  return total;
}
