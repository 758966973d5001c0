/** The peers' workers call the model the way their own code would: the `openai` client. */
import OpenAI from 'openai';

export function modelCaller(baseURL: string): (input: string) => Promise<string> {
  const client = new OpenAI({ baseURL, apiKey: 'k' });
  return async (input) => {
    const answer = await client.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: input }],
    });
    return answer.choices[0]?.message.content ?? '';
  };
}
