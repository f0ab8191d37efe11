// spinkv's wasm runtime for JavaScript: instantiates spinkv_wasm.wasm and wraps its plain
// exports (see crates/spinkv-wasm/src/abi.rs). Used by the page's Web Worker and by node
// (crates/spinkv-wasm/runtime.mjs). No dependencies.
//
//   const rt = await SpinKV.instantiate(wasmBytesOrResponse);
//   const h = rt.newBuffer(n);  rt.bytes(h).set(chunk, offset)  // fill in place
//   rt.call("load", {name, files: {"model.safetensors": h, ...}, ...})
//
// Memory can grow during any call, so views are taken fresh (rt.bytes) and never kept.

export class SpinKVError extends Error {
  constructor(reply) {
    super(reply.error);
    this.name = reply.kind || "SpinkvError";
    this.kind = reply.kind;
    this.fields = reply.fields || [];
  }
}

export class SpinKV {
  static async instantiate(source, { log = (line) => console.log(line) } = {}) {
    let memory = null;
    const decoder = new TextDecoder();
    const random = new Uint32Array(1);
    const env = {
      log: (ptr, len) => log(decoder.decode(new Uint8Array(memory.buffer, ptr >>> 0, len >>> 0))),
      now: () => performance.now(),
      random_u32: () => {
        crypto.getRandomValues(random);
        return random[0] | 0;
      },
    };
    let result;
    if (typeof Response !== "undefined" && source instanceof Response) {
      result = WebAssembly.instantiateStreaming
        ? await WebAssembly.instantiateStreaming(source, { env })
        : await WebAssembly.instantiate(await source.arrayBuffer(), { env });
    } else {
      result = await WebAssembly.instantiate(source, { env });
    }
    const instance = result.instance;
    memory = instance.exports.memory;
    return new SpinKV(instance, memory);
  }

  constructor(instance, memory) {
    this.exports = instance.exports;
    this.memory = memory;
    this.encoder = new TextEncoder();
    this.decoder = new TextDecoder();
    if (!this.exports.spk_call) {
      throw new Error("this wasm module was built without the runtime (feature `runtime`)");
    }
  }

  /** Calls `op` with `args`; returns the reply object or throws SpinKVError. */
  call(op, args = {}) {
    const request = this.encoder.encode(JSON.stringify({ ...args, op }));
    const ptr = this.exports.spk_input(request.length) >>> 0;
    new Uint8Array(this.memory.buffer, ptr, request.length).set(request);
    const status = this.exports.spk_call(request.length);
    const reply = JSON.parse(this.decoder.decode(this.output()));
    if (status !== 0) throw new SpinKVError(reply);
    return reply;
  }

  output() {
    const ptr = this.exports.spk_output_ptr() >>> 0;
    const len = this.exports.spk_output_len() >>> 0;
    return new Uint8Array(this.memory.buffer, ptr, len);
  }

  /** A buffer of `len` bytes inside wasm memory; returns its handle. */
  newBuffer(len) {
    const handle = this.exports.spk_buffer_new(len);
    if (handle === 0) throw new SpinKVError(JSON.parse(this.decoder.decode(this.output())));
    return handle;
  }

  /** A fresh view of a buffer (valid until the next call that may grow memory). */
  bytes(handle) {
    const ptr = this.exports.spk_buffer_ptr(handle) >>> 0;
    const len = this.exports.spk_buffer_len(handle) >>> 0;
    if (ptr === 0 && len === 0) throw new Error(`no buffer ${handle}`);
    return new Uint8Array(this.memory.buffer, ptr, len);
  }

  /** Copies bytes into a new buffer. */
  bufferFrom(bytes) {
    const handle = this.newBuffer(bytes.length);
    this.bytes(handle).set(bytes);
    return handle;
  }

  /** Copies a buffer out and frees it. */
  takeBuffer(handle) {
    const copy = this.bytes(handle).slice();
    this.exports.spk_buffer_free(handle);
    return copy;
  }

  freeBuffer(handle) {
    this.exports.spk_buffer_free(handle);
  }

  /** Streams a fetch Response body straight into a new buffer of `size` bytes. */
  async bufferFromResponse(response, size, onProgress = () => {}) {
    const handle = this.newBuffer(size);
    let offset = 0;
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (offset + value.length > size) throw new Error("response is longer than announced");
      this.bytes(handle).set(value, offset);
      offset += value.length;
      onProgress(offset, size);
    }
    if (offset !== size) throw new Error(`response ended after ${offset} of ${size} bytes`);
    return handle;
  }

  pages() {
    return this.memory.buffer.byteLength / 65536;
  }
}
