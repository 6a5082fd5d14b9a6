// "Code for these settings": the request the page's settings make, as curl, Python (httpx and OpenAI's SDK) and
// JavaScript. The key always comes from the environment variable RTVOICE_API_KEY, never from the page.

/** OpenAI's speech request body for `settings` ({text, voice, speed, seed, format}). */
export function speechBody({ text, voice, speed, seed, format }) {
  const body = { model: "tts-1", input: text, voice, response_format: format, speed };
  if (seed !== null) body.seed = seed;
  return body;
}

const shellQuote = (value) => `'${value.replace(/'/g, `'\\''`)}'`;

// A JSON value as a Python literal (JSON's string escapes are Python's too).
function python(value, indent = "") {
  if (value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  const inner = `${indent}    `;
  const items = Object.entries(value).map(([k, v]) => `${inner}${JSON.stringify(k)}: ${python(v, inner)},`);
  return `{\n${items.join("\n")}\n${indent}}`;
}

/** Each snippet for `settings` against the server at `origin`: {curl, python, openai, js}. */
export function snippets(origin, settings) {
  const body = speechBody(settings);
  const file = `speech.${settings.format}`;
  const url = `${origin}/v1/audio/speech`;
  const curl = [
    `curl -sS --fail-with-body ${shellQuote(url)} \\`,
    `  -H "Authorization: Bearer $RTVOICE_API_KEY" \\`,
    `  -H "Content-Type: application/json" \\`,
    `  -d ${shellQuote(JSON.stringify(body))} \\`,
    `  -o ${file}`,
  ].join("\n");
  const py = [
    "import os",
    "",
    "import httpx",
    "",
    `body = ${python(body)}`,
    'headers = {"Authorization": f"Bearer {os.environ.get(\'RTVOICE_API_KEY\', \'unused\')}"}',
    `with httpx.stream("POST", ${JSON.stringify(url)}, json=body, headers=headers, timeout=60) as response:`,
    "    response.raise_for_status()",
    `    with open(${JSON.stringify(file)}, "wb") as out:`,
    "        for chunk in response.iter_bytes():  # audio arrives while the rest is being made",
    "            out.write(chunk)",
  ].join("\n");
  const sdkArgs = [
    `    model="tts-1",`,
    `    voice=${JSON.stringify(settings.voice)},`,
    `    input=${JSON.stringify(settings.text)},`,
    `    response_format=${JSON.stringify(settings.format)},`,
    `    speed=${settings.speed},`,
  ];
  if (settings.seed !== null) sdkArgs.push(`    extra_body={"seed": ${settings.seed}},  # rtvoice's extension`);
  const openai = [
    "import os",
    "",
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url=${JSON.stringify(`${origin}/v1`)}, api_key=os.environ.get("RTVOICE_API_KEY", "unused"))`,
    "with client.audio.speech.with_streaming_response.create(",
    ...sdkArgs,
    ") as response:",
    `    response.stream_to_file(${JSON.stringify(file)})`,
  ].join("\n");
  const js = [
    "// Node 18+ (as an ES module); in a browser, read response.body instead of writing a file.",
    'import { writeFile } from "node:fs/promises";',
    "",
    `const response = await fetch(${JSON.stringify(url)}, {`,
    '  method: "POST",',
    '  headers: { "Content-Type": "application/json", Authorization: `Bearer ${process.env.RTVOICE_API_KEY}` },',
    `  body: JSON.stringify(${JSON.stringify(body, null, 2).replace(/\n/g, "\n  ")}),`,
    "});",
    "if (!response.ok) throw new Error(await response.text());",
    `await writeFile(${JSON.stringify(file)}, Buffer.from(await response.arrayBuffer()));`,
  ].join("\n");
  return { curl, python: py, openai, js };
}
