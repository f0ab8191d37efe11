//! Anonymous memory the kernel may back with 2 MiB pages: what the KV page pool's slabs and the
//! model's weights (spinkv-model) are read from, a few KiB at a time across tens or hundreds of
//! MB every decode step, where 4 KiB pages cost a page walk per read.

use memmap2::{MmapMut, MmapOptions};

/// `len` zeroed bytes (`len > 0`) of anonymous memory, advised for transparent huge pages on
/// Linux. The advice is only a hint: without transparent huge pages the memory sits in 4 KiB
/// pages. Fails where anonymous maps are unavailable (wasm32).
pub fn map_anonymous(len: usize) -> std::io::Result<MmapMut> {
    let map = MmapOptions::new().len(len).map_anon()?;
    #[cfg(target_os = "linux")]
    {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    Ok(map)
}
