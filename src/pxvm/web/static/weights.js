// The weight viewer: the served model's tensors (GET /api/weights), each drawn from PNG
// tiles of TILE x TILE pixels (GET /api/weights/tile?tensor=&z=&x=&y=): at level z a
// pixel is the mean of 2^z x 2^z weights. Zooming in past level 0 enlarges the pixels.

const $ = (id) => document.getElementById(id);
const view = $("view");
const ctx = view.getContext("2d");
const MAX_MAGNIFY = 3;      // past level 0: pixels drawn 2, 4, 8 screen pixels wide
const CACHE_TILES = 256;    // tiles kept decoded

let listing = null;
let tensor = null;          // the listing's entry shown
let zoom = 0;               // > 0: magnified level 0; <= 0: level -zoom
let centre = [0, 0];        // the weight (column, row) at the canvas's centre
const tiles = new Map();    // url -> Image, oldest first

function level() { return Math.max(0, -zoom); }
function pixelsPerWeight() { return zoom > 0 ? 2 ** zoom : 1 / 2 ** level(); }

function tile(url) {
  let image = tiles.get(url);
  if (image) {
    tiles.delete(url);      // most recently used last
    tiles.set(url, image);
    return image;
  }
  image = new Image();
  image.onload = draw;
  image.src = url;
  tiles.set(url, image);
  if (tiles.size > CACHE_TILES) tiles.delete(tiles.keys().next().value);
  return image;
}

function draw() {
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(0, 0, view.width, view.height);
  if (!tensor) return;
  const z = level(), scale = pixelsPerWeight(), span = listing.tile * 2 ** z;
  const left = centre[0] - view.width / 2 / scale, top = centre[1] - view.height / 2 / scale;
  const x0 = Math.max(0, Math.floor(left / span)), y0 = Math.max(0, Math.floor(top / span));
  const x1 = Math.min(Math.ceil(tensor.cols / span), Math.ceil((left + view.width / scale) / span));
  const y1 = Math.min(Math.ceil(tensor.rows / span), Math.ceil((top + view.height / scale) / span));
  const name = encodeURIComponent(tensor.name);
  for (let y = y0; y < y1; y++) {
    for (let x = x0; x < x1; x++) {
      const image = tile(`/api/weights/tile?tensor=${name}&z=${z}&x=${x}&y=${y}`);
      if (!image.complete || !image.naturalWidth) continue;
      const px = (x * span - left) * scale, py = (y * span - top) * scale;
      ctx.drawImage(image, px, py, image.naturalWidth * span / listing.tile * scale,
                    image.naturalHeight * span / listing.tile * scale);
    }
  }
}

function zoomBy(step, at) {
  const levels = tensor.levels;
  const next = Math.min(MAX_MAGNIFY, Math.max(-(levels - 1), zoom + step));
  if (next === zoom) return;
  // keep the weight under `at` (canvas pixels) where it is
  const before = pixelsPerWeight();
  const point = [centre[0] + (at[0] - view.width / 2) / before,
                 centre[1] + (at[1] - view.height / 2) / before];
  zoom = next;
  const after = pixelsPerWeight();
  centre = [point[0] - (at[0] - view.width / 2) / after,
            point[1] - (at[1] - view.height / 2) / after];
  showWhere();
  draw();
}

function moveBy(dx, dy) {
  const scale = pixelsPerWeight();
  centre = [centre[0] - dx / scale, centre[1] - dy / scale];
  draw();
}

function showWhere(at) {
  const z = level();
  let text = `level ${z}: ${zoom > 0 ? `a weight is ${2 ** zoom}x${2 ** zoom} pixels`
                                    : `a pixel is the mean of ${2 ** z}x${2 ** z} weights`}`;
  if (at) {
    const scale = pixelsPerWeight();
    const col = Math.floor(centre[0] + (at[0] - view.width / 2) / scale);
    const row = Math.floor(centre[1] + (at[1] - view.height / 2) / scale);
    if (row >= 0 && col >= 0 && row < tensor.rows && col < tensor.cols) {
      text += ` | row ${row.toLocaleString()}, column ${col.toLocaleString()}`;
    }
  }
  $("where").textContent = text;
}

async function select(entry, item) {
  for (const li of $("tensors").children) li.setAttribute("aria-selected", "false");
  item.setAttribute("aria-selected", "true");
  tensor = entry;
  zoom = -(entry.levels - 1);
  centre = [entry.cols / 2, entry.rows / 2];
  $("info").textContent = `${entry.name}: ${entry.type}, ${entry.rows.toLocaleString()} rows of `
    + `${entry.cols.toLocaleString()} weights (statistics: computing...)`;
  showWhere();
  draw();
  const answer = await fetch(`/api/weights/stats?tensor=${encodeURIComponent(entry.name)}`);
  const stats = await answer.json();
  if (tensor !== entry) return;
  if (!answer.ok) {
    $("info").textContent = `${entry.name}: ${stats.error}`;
    return;
  }
  const g = (v) => Number(v).toPrecision(3);
  $("info").textContent = `${entry.name}: ${entry.type}, ${entry.rows.toLocaleString()} x `
    + `${entry.cols.toLocaleString()}; range [${g(stats.min)}, ${g(stats.max)}], mean `
    + `${g(stats.mean)}, std ${g(stats.std)}, peak ${Number(stats.peak).toFixed(1)} std`;
  $("limit").textContent = `L = ${g(stats.limit)}`;
}

function listTensors() {
  const words = $("filter").value.trim().toLowerCase();
  const list = $("tensors");
  list.replaceChildren();
  for (const entry of listing.tensors) {
    if (words && !entry.name.toLowerCase().includes(words)) continue;
    const item = document.createElement("li");
    item.setAttribute("aria-selected", String(entry === tensor));
    item.title = entry.name;
    item.append(entry.name + " ");
    const note = document.createElement("span");
    note.className = "dim";
    note.textContent = `${entry.type} ${entry.rows}x${entry.cols}`;
    item.append(note);
    item.addEventListener("click", () => select(entry, item));
    list.append(item);
  }
}

function legend() {
  const bar = $("bar").getContext("2d");
  listing.colours.forEach((colour, i) => {
    bar.fillStyle = colour;
    bar.fillRect(i, 0, 1, 12);
  });
}

function listen() {
  let drag = null;
  view.addEventListener("wheel", (event) => {
    if (!tensor) return;
    event.preventDefault();
    const box = view.getBoundingClientRect();
    const at = [(event.clientX - box.left) * view.width / box.width,
                (event.clientY - box.top) * view.height / box.height];
    zoomBy(event.deltaY < 0 ? 1 : -1, at);
  }, { passive: false });
  view.addEventListener("pointerdown", (event) => {
    drag = [event.clientX, event.clientY];
    view.setPointerCapture(event.pointerId);
  });
  view.addEventListener("pointermove", (event) => {
    const box = view.getBoundingClientRect();
    if (tensor) showWhere([(event.clientX - box.left) * view.width / box.width,
                           (event.clientY - box.top) * view.height / box.height]);
    if (!drag || !tensor) return;
    moveBy(event.clientX - drag[0], event.clientY - drag[1]);
    drag = [event.clientX, event.clientY];
  });
  view.addEventListener("pointerup", () => { drag = null; });
  view.addEventListener("keydown", (event) => {
    if (!tensor) return;
    const middle = [view.width / 2, view.height / 2];
    const moves = { ArrowLeft: [64, 0], ArrowRight: [-64, 0], ArrowUp: [0, 64], ArrowDown: [0, -64] };
    if (event.key === "+" || event.key === "=") zoomBy(1, middle);
    else if (event.key === "-") zoomBy(-1, middle);
    else if (moves[event.key]) moveBy(...moves[event.key]);
    else return;
    event.preventDefault();
  });
  $("filter").addEventListener("input", listTensors);
}

async function start() {
  const answer = await fetch("/api/weights");
  const body = await answer.json();
  if (!answer.ok) {
    $("info").textContent = `no model to show: ${body.error}`;
    return;
  }
  listing = body;
  $("model").textContent = listing.model;
  $("info").textContent = `${listing.tensors.length} tensors: pick one`;
  legend();
  listTensors();
  listen();
}

start();
