// Encodes each file named on the command line with Hugging Face's JavaScript tokenizers
// (@huggingface/tokenizers, the reference for tokenizer.json) and prints the ids of each file's
// text, without BOS/EOS or other template tokens, one per line; with --decode, decodes them back
// and prints the text instead; with --json, prints a JSON list of each file's ids.
// Usage: node encode_with_hf_tokenizers.mjs NODE_MODULES_DIR TOKENIZER_DIR [--decode|--json] FILE...
import fs from 'fs';
import path from 'path';
import { pathToFileURL } from 'url';

const [modules, dir, ...rest] = process.argv.slice(2);
const decode = rest[0] === '--decode';
const asJson = rest[0] === '--json';
const files = decode || asJson ? rest.slice(1) : rest;
const { Tokenizer } = await import(pathToFileURL(path.join(modules, '@huggingface/tokenizers/dist/tokenizers.mjs')));
const read = (name) => JSON.parse(fs.readFileSync(path.join(dir, name), 'utf-8'));
const config = fs.existsSync(path.join(dir, 'tokenizer_config.json')) ? read('tokenizer_config.json') : {};
const tokenizer = new Tokenizer(read('tokenizer.json'), config);
const out = [];
if (asJson) {
  const lists = files.map((f) => tokenizer.encode(fs.readFileSync(f, 'utf-8'), { add_special_tokens: false }).ids);
  fs.writeFileSync(1, JSON.stringify(lists) + '\n');
  process.exit(0);
}
for (const f of files) {
  const ids = tokenizer.encode(fs.readFileSync(f, 'utf-8'), { add_special_tokens: false }).ids;
  if (decode) out.push(tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
  else for (const id of ids) out.push(String(id));
}
fs.writeFileSync(1, decode ? out.join('') : out.join('\n') + '\n');
