/** Paging shared by every list route: the page size a client asked for, and a byte ceiling per page. */

export const DEFAULT_PAGE = 100;
export const MAX_PAGE = 1000;
/** A page stops growing past this many bytes of JSON. */
export const MAX_PAGE_BYTES = 4 * 1024 * 1024;

/**
 * The rows of a page: `limit` (the schema lets only whole numbers of 1 or more through; larger
 * than MAX_PAGE gives MAX_PAGE), DEFAULT_PAGE when absent.
 */
export const pageLimit = (limit: string | undefined): number =>
  limit === undefined ? DEFAULT_PAGE : Math.min(MAX_PAGE, Number(limit));

/**
 * The items of a page, in order, until the page holds `limit` items or MAX_PAGE_BYTES of JSON
 * (at least one item). `rows` may hold one more than `limit`: then there is more to read.
 */
export function fillPage<R, I>(
  rows: R[],
  limit: number,
  render: (row: R) => I,
): { data: I[]; more: boolean } {
  const data: I[] = [];
  let bytes = 0;
  for (const row of rows.slice(0, limit)) {
    const item = render(row);
    bytes += Buffer.byteLength(JSON.stringify(item));
    if (bytes > MAX_PAGE_BYTES && data.length > 0) break;
    data.push(item);
  }
  return { data, more: rows.length > data.length };
}
