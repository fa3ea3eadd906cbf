// A bounded reader of a GGUF file's header, as pxvm/llm/gguf_scan.py reads it: every
// count and length is checked against the same bounds and against the bytes left before
// anything is allocated or walked, so a crafted file fails fast with a message naming the
// field. Only the header is read (from a `read(offset, length)` of the file); the tensor
// data stays where it is until the page uploads it.

export const BOUNDS = {
  tensors: 2 ** 16, keys: 2 ** 16, keyBytes: 2 ** 16 - 1, tensorNameBytes: 256,
  stringBytes: 2 ** 24, arrayLength: 2 ** 21, metadataValues: 2 ** 22,
  headerBytes: 2 ** 26, dims: 4, alignment: 2 ** 16,
};
const VERSIONS = [2, 3];
const DEFAULT_ALIGNMENT = 32;

// GGML type -> [name, values per block, bytes per block] (the gguf package's table)
export const GGML_TYPES = {
  0: ["F32", 1, 4], 1: ["F16", 1, 2], 2: ["Q4_0", 32, 18], 3: ["Q4_1", 32, 20],
  6: ["Q5_0", 32, 22], 7: ["Q5_1", 32, 24], 8: ["Q8_0", 32, 34], 9: ["Q8_1", 32, 40],
  10: ["Q2_K", 256, 84], 11: ["Q3_K", 256, 110], 12: ["Q4_K", 256, 144], 13: ["Q5_K", 256, 176],
  14: ["Q6_K", 256, 210], 15: ["Q8_K", 256, 292], 16: ["IQ2_XXS", 256, 66], 17: ["IQ2_XS", 256, 74],
  18: ["IQ3_XXS", 256, 98], 19: ["IQ1_S", 256, 50], 20: ["IQ4_NL", 32, 18], 21: ["IQ3_S", 256, 110],
  22: ["IQ2_S", 256, 82], 23: ["IQ4_XS", 256, 136], 24: ["I8", 1, 1], 25: ["I16", 1, 2],
  26: ["I32", 1, 4], 27: ["I64", 1, 8], 28: ["F64", 1, 8], 29: ["IQ1_M", 256, 56],
  30: ["BF16", 1, 2], 34: ["TQ1_0", 256, 54], 35: ["TQ2_0", 256, 66], 39: ["MXFP4", 32, 17],
  40: ["NVFP4", 64, 36], 41: ["Q1_0", 128, 18],
};
// value type -> bytes of one scalar; 8 = string, 9 = array
const SCALAR_BYTES = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const STRING = 8;
const ARRAY = 9;

export class GGUFError extends Error {}
class NeedMore extends Error {}

// The header of a file of `size` bytes whose bytes `read(offset, length)` gives (a
// promise of a Uint8Array); reads more of the file as the header needs it, up to the bound.
export async function readHeader(read, size, where = "the file") {
  let have = Math.min(size, 1 << 22);
  for (;;) {
    const bytes = await read(0, have);
    try {
      return parseHeader(bytes, size, where);
    } catch (e) {
      if (!(e instanceof NeedMore)) throw e;
      have = Math.min(size, BOUNDS.headerBytes, have * 4);
    }
  }
}

// The header from its first `bytes` (a Uint8Array) of a file of `size` bytes; NeedMore
// when the header goes on past them, GGUFError for anything out of bounds.
export function parseHeader(bytes, size, where = "the file") {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const decoder = new TextDecoder("utf-8", { fatal: false });
  let pos = 0;
  let values = 0;
  const fail = (message) => { throw new GGUFError(`${where}: ${message}`); };
  const fmt = (n) => Number(n).toLocaleString("en-US");
  const take = (n, what) => {
    if (n > size - pos) {
      fail(`${what} needs ${fmt(n)} bytes at byte ${fmt(pos)}, but only ${fmt(size - pos)} are ` +
        "left: the file is truncated or damaged; download it again");
    }
    if (pos + n > BOUNDS.headerBytes) {
      fail(`${what} ends past byte ${fmt(pos + n)}: the GGUF header is over the bound of ` +
        `${fmt(BOUNDS.headerBytes)} bytes`);
    }
    if (pos + n > bytes.length) throw new NeedMore();
    const at = pos;
    pos += n;
    return at;
  };
  const u32 = (what) => view.getUint32(take(4, what), true);
  const u64 = (what) => {
    const at = take(8, what);
    const hi = view.getUint32(at + 4, true);
    // counts and lengths past 2^53 are out of every bound: keep them huge, not wrapped
    return hi >= 2 ** 21 ? Number.MAX_SAFE_INTEGER : hi * 2 ** 32 + view.getUint32(at, true);
  };
  const countFits = (count, smallest, subject, items, bound) => {
    if (count > bound) fail(`${subject} ${fmt(count)} ${items}, over the bound of ${fmt(bound)}`);
    if (count * smallest > size - pos) {
      fail(`${subject} ${fmt(count)} ${items} of at least ${smallest} bytes each, but only ` +
        `${fmt(size - pos)} bytes are left in the file: it is truncated or damaged; download it again`);
    }
  };
  const rawString = (what, bound) => {
    const n = u64(`the length of ${what}`);
    if (n > bound) fail(`${what} has a length of ${fmt(n)} bytes, over the bound of ${fmt(bound)}`);
    const at = take(n, what);
    return bytes.subarray(at, at + n);
  };
  const name = (what, bound) => decoder.decode(rawString(what, bound));

  const value = (code, key, depth) => {
    if (code in SCALAR_BYTES) {
      const at = take(SCALAR_BYTES[code], `metadata '${key}'`);
      switch (code) {
        case 0: return view.getUint8(at);
        case 1: return view.getInt8(at);
        case 2: return view.getUint16(at, true);
        case 3: return view.getInt16(at, true);
        case 4: return view.getUint32(at, true);
        case 5: return view.getInt32(at, true);
        case 6: return view.getFloat32(at, true);
        case 7: return view.getUint8(at) !== 0;
        case 12: return view.getFloat64(at, true);
        default: return Number(view.getBigInt64(at, true));
      }
    }
    if (code === STRING) return decoder.decode(rawString(`metadata '${key}'`, BOUNDS.stringBytes));
    if (code === ARRAY) return array(key, depth);
    return fail(`metadata '${key}' has value type ${code}, which GGUF does not define`);
  };
  const array = (key, depth) => {
    const what = `metadata '${key}'`;
    const element = u32(`the element type of ${what}`);
    if (element === ARRAY && depth >= 1) fail(`${what} nests arrays more than one level deep`);
    if (!(element in SCALAR_BYTES) && element !== STRING && element !== ARRAY) {
      fail(`${what} is an array of value type ${element}, which GGUF does not define`);
    }
    const count = u64(`the element count of ${what}`);
    const smallest = element in SCALAR_BYTES ? SCALAR_BYTES[element] : element === STRING ? 8 : 12;
    countFits(count, smallest, `${what} is an array of`, "elements", BOUNDS.arrayLength);
    if (values + count > BOUNDS.metadataValues) {
      fail(`${what} brings the header's array elements to ${fmt(values + count)}, over the ` +
        `bound of ${fmt(BOUNDS.metadataValues)}`);
    }
    values += count;
    if (element in SCALAR_BYTES) {  // kept as a count: the page needs no vocabulary
      take(count * SCALAR_BYTES[element], what);
      return { array: count };
    }
    if (element === STRING) {
      for (let i = 0; i < count; i++) rawString(`${what}[${i}]`, BOUNDS.stringBytes);
      return { array: count };
    }
    for (let i = 0; i < count; i++) array(key, depth + 1);
    return { array: count };
  };

  const magic = bytes.length >= 4 ? String.fromCharCode(...bytes.subarray(0, 4)) : "";
  take(4, "the GGUF magic");
  if (magic !== "GGUF") {
    fail(`is not a GGUF file (it starts with ${JSON.stringify(magic)}, not "GGUF"); choose a .gguf model`);
  }
  const version = u32("the GGUF version");
  if (!VERSIONS.includes(version)) {
    fail(`has GGUF version ${fmt(version)}; pxvm reads versions ${VERSIONS.join(" and ")}`);
  }
  const nTensors = u64("the tensor count");
  const nKeys = u64("the metadata count");
  countFits(nKeys, 13, "the header declares", "metadata keys", BOUNDS.keys);
  countFits(nTensors, 24, "the header declares", "tensors", BOUNDS.tensors);
  const metadata = {};
  for (let i = 0; i < nKeys; i++) {
    const at = pos;
    const key = name(`metadata key #${i}`, BOUNDS.keyBytes);
    if (key in metadata) fail(`metadata key '${key}' appears twice (again at byte ${fmt(at)})`);
    metadata[key] = value(u32(`the value type of metadata '${key}'`), key, 0);
  }
  let alignment = DEFAULT_ALIGNMENT;
  if ("general.alignment" in metadata) {
    alignment = metadata["general.alignment"];
    if (!Number.isInteger(alignment) || alignment < 1 || alignment > BOUNDS.alignment ||
        (alignment & (alignment - 1))) {
      fail(`metadata 'general.alignment' is ${alignment}; it must be a power of two from 1 to ${fmt(BOUNDS.alignment)}`);
    }
  }
  const tensors = [];
  const names = new Set();
  for (let i = 0; i < nTensors; i++) {
    const tname = name(`the name of tensor #${i}`, BOUNDS.tensorNameBytes);
    const what = `tensor '${tname}'`;
    if (names.has(tname)) fail(`${what} appears twice`);
    names.add(tname);
    const nDims = u32(`the dimension count of ${what}`);
    if (nDims > BOUNDS.dims) fail(`${what} has ${fmt(nDims)} dimensions, over the bound of ${BOUNDS.dims}`);
    const dims = [];
    for (let d = 0; d < nDims; d++) {
      const n = u64(`the dimensions of ${what}`);
      if (n < 1) fail(`${what} has dimension ${d} of size ${n}; every dimension must be at least 1`);
      dims.push(n);
    }
    const elements = dims.reduce((a, b) => a * b, 1);
    const code = u32(`the GGML type of ${what}`);
    const type = GGML_TYPES[code];
    if (!type) fail(`${what} has GGML type ${code}, which does not exist`);
    const row = dims.length ? dims[0] : 1;
    if (row % type[1]) fail(`${what} has rows of ${fmt(row)} values, not a multiple of ${type[0]}'s block of ${type[1]}`);
    if (elements > Number.MAX_SAFE_INTEGER / type[2]) fail(`${what} has dims [${dims}]: too many elements`);
    const offset = u64(`the data offset of ${what}`);
    tensors.push({ name: tname, dims, type: type[0], offset, nBytes: elements / type[1] * type[2] });
  }
  const dataOffset = Math.ceil(pos / alignment) * alignment;
  for (const t of tensors) {
    if (t.offset % alignment) fail(`tensor '${t.name}' has data offset ${fmt(t.offset)}, not a multiple of the alignment ${alignment}`);
    t.offset += dataOffset;
    if (t.offset + t.nBytes > size) {
      fail(`tensor '${t.name}' (${t.type}, dims [${t.dims}]) needs bytes ${fmt(t.offset)}..${fmt(t.offset + t.nBytes)}, ` +
        `past the end of the file at ${fmt(size)}: the file is truncated or damaged; download it again`);
    }
  }
  const sorted = [...tensors].sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const p = sorted[i - 1];
    if (sorted[i].offset < p.offset + p.nBytes) fail(`tensor '${sorted[i].name}' overlaps tensor '${p.name}'`);
  }
  return { version, metadata, tensors: new Map(tensors.map((t) => [t.name, t])), alignment, dataOffset, size };
}

// The 1-D tensors in file order: what the page sends the server after the header
// (pxvm/web/llm_plans.py vector_tensors).
export function vectorTensors(header) {
  return [...header.tensors.values()].filter((t) => t.dims.length === 1).sort((a, b) => a.offset - b.offset);
}
