/** Shows a client value inside a message without echoing megabytes of it back. */
export function shown(value: unknown, max = 80): string {
  let text: string;
  try {
    text = typeof value === 'string' ? value : (JSON.stringify(value) ?? String(value));
  } catch {
    // Too deep to write out (JSON.stringify and String both recurse): say what it is.
    text = Array.isArray(value)
      ? '[...]'
      : value !== null && typeof value === 'object'
        ? '{...}'
        : typeof value;
  }
  return text.length > max ? `${text.slice(0, max)}... (${text.length} characters)` : text;
}
