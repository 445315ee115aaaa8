use candle_core::{Device, Tensor};
use models::ops::{segment_mean, SegmentCsr};
fn main() {
    let (n_src, n_dst, h, fan) = (36564usize, 10094usize, 128usize, 9usize);
    let mut st = 12345u64;
    let mut rnd = || { st ^= st << 13; st ^= st >> 7; st ^= st << 17; st };
    let offsets: Vec<u32> = (0..=n_dst).map(|d| (d * fan) as u32).collect();
    let sources: Vec<u32> = (0..n_dst * fan).map(|_| (rnd() % n_src as u64) as u32).collect();
    let csr = SegmentCsr::new(n_src, offsets, sources);
    let x = Tensor::rand(0f32, 1f32, (n_src, h), &Device::Cpu).unwrap();
    let g = Tensor::rand(0f32, 1f32, (n_dst, h), &Device::Cpu).unwrap();
    for _ in 0..3 { let _ = segment_mean(&x, &csr).unwrap(); }
    let t = std::time::Instant::now();
    let mut s = 0f32;
    for _ in 0..50 { s += segment_mean(&x, &csr).unwrap().get(0).unwrap().get(0).unwrap().to_scalar::<f32>().unwrap(); }
    println!("fwd {:.3} ms ({s})", t.elapsed().as_secs_f64() * 1e3 / 50.0);
    let xv = candle_core::Var::from_tensor(&x).unwrap();
    let t = std::time::Instant::now();
    for _ in 0..20 { let y = segment_mean(xv.as_tensor(), &csr).unwrap(); let gr = (y * &g).unwrap().sum_all().unwrap().backward().unwrap(); let _ = gr.get(xv.as_tensor()).unwrap(); }
    println!("fwd+bwd {:.3} ms", t.elapsed().as_secs_f64() * 1e3 / 20.0);
}
