/**
 * Values on their way into jsonb. PostgreSQL refuses U+0000 and unpaired UTF-16 surrogates in
 * jsonb text: client input with them is refused at the door (400), and text the server did not
 * choose (a model's answer, an error message quoting binary data) is cleaned here instead, so
 * a finish write can never fail on it.
 */
// eslint-disable-next-line no-control-regex -- U+0000 is exactly what this looks for
const unsafe = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const unsafeAll = new RegExp(unsafe.source, 'g');

/** Whether jsonb would refuse the text: a NUL or an unpaired surrogate in it. */
export const isUnstorable = (text: string): boolean => unsafe.test(text);

/** The text with NULs and unpaired surrogates replaced by U+FFFD. */
export function cleanText(text: string): string {
  return unsafe.test(text) ? text.replace(unsafeAll, '\ufffd') : text;
}

/** A deep copy with every string and key cleaned; undefined members are left out, as JSON would. */
export function cleanJson(value: unknown): unknown {
  if (typeof value === 'string') return cleanText(value);
  if (Array.isArray(value)) return value.map(cleanJson);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [key, inner] of Object.entries(value)) {
      // defineProperty: a key named `__proto__` stays a plain key.
      if (inner !== undefined)
        Object.defineProperty(out, cleanText(key), {
          value: cleanJson(inner),
          enumerable: true,
          writable: true,
        });
    }
    return out;
  }
  return value;
}

/** The JSON text of a value for a `$n::jsonb` parameter; null for undefined. */
export function toJsonb(value: unknown): string | null {
  return value === undefined ? null : JSON.stringify(cleanJson(value));
}
