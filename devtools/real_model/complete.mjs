// Answers the service's summarisation requests with a real small model, by hand.
//
// Reads a JSON array of requests ({name, messages: [{role, content}], max_tokens})
// from the file given as the first argument, writes a JSON array of answers
// ({name, text, stop_reason, prompt_tokens, completion_tokens, seconds}) to stdout.
//
// The messages are rendered with the GGUF's own chat template (SmolLM2's is
// ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
// "<|im_start|>assistant\n"), as llama.cpp's OpenAI-compatible server would, and
// decoded greedily (the service sends temperature 0) with no repeat penalty.
// Not part of the product nor of CI: node-llama-cpp lives in a node_modules under
// /tmp (devtools/real_model/README.md).
import {readFileSync} from "node:fs";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

const [requestsPath] = process.argv.slice(2);
const modelPath = process.env.REAL_MODEL_GGUF;
const nodeDir = process.env.REAL_MODEL_NODE_DIR; // where `npm install node-llama-cpp` ran
if (!requestsPath || !modelPath || !nodeDir) {
    console.error("usage: REAL_MODEL_GGUF=<.gguf> REAL_MODEL_NODE_DIR=<dir> node complete.mjs <requests.json>");
    process.exit(2);
}
const entry = join(nodeDir, "node_modules", "node-llama-cpp", "dist", "index.js");
const {getLlama, LlamaCompletion, readGgufFileInfo} = await import(pathToFileURL(entry).href);

const info = await readGgufFileInfo(modelPath);
const template = info.metadata.tokenizer.chat_template ?? "";
if (!template.includes("<|im_start|>")) {
    console.error("this runner renders ChatML only; the model's template is:\n" + template);
    process.exit(2);
}

function chatml(messages) {
    // As the template: a default system message only when the first is not one.
    let text = messages[0]?.role === "system"
        ? ""
        : "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    for (const m of messages) text += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
    return text + "<|im_start|>assistant\n";
}

const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 8192, threads: 1});
const answers = [];
for (const request of JSON.parse(readFileSync(requestsPath, "utf8"))) {
    const sequence = context.getSequence();
    const completion = new LlamaCompletion({contextSequence: sequence});
    const prompt = model.tokenize(chatml(request.messages), true);
    const started = Date.now();
    const result = await completion.generateCompletionWithMeta(prompt, {
        maxTokens: request.max_tokens,
        temperature: 0,
        repeatPenalty: false,
    });
    answers.push({
        name: request.name,
        text: result.response,
        stop_reason: result.metadata.stopReason,
        prompt_tokens: prompt.length,
        completion_tokens: model.tokenize(result.response, false).length,
        plain_tokens: model.tokenize(request.plain_text, false).length,
        seconds: (Date.now() - started) / 1000,
    });
    completion.dispose();
    sequence.dispose();
}
process.stdout.write(JSON.stringify(answers, null, 1) + "\n");
await context.dispose();
await model.dispose();
