//! `hetgnn plot`: loss and accuracy curves of a run report, as a PNG.

use std::path::Path;

use actors::Report;
use anyhow::{anyhow, Context};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

pub fn run(report: &Path, out: &Path) -> anyhow::Result<()> {
    let r = Report::read(report)?;
    if r.epochs.is_empty() {
        anyhow::bail!("{} has no epochs to plot", report.display());
    }
    // A bundled font: no system font libraries needed.
    register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).map_err(|_| anyhow!("bundled font is invalid"))?;
    draw(&r, out).map_err(|e| anyhow!("{e}")).with_context(|| format!("drawing {}", out.display()))?;
    sayln!("wrote {}", out.display());
    Ok(())
}

fn draw(r: &Report, out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(out, (1200, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    let epochs: Vec<f64> = r.epochs.iter().map(|e| e.epoch as f64).collect();
    let x_max = epochs.last().copied().unwrap_or(0.0).max(1.0);
    let title = format!("{} — {}", r.mode, r.config.training.model);

    let loss_max = r.epochs.iter().map(|e| e.loss).fold(0.0, f64::max) * 1.05 + 1e-9;
    let mut chart = ChartBuilder::on(&left)
        .caption(format!("training loss ({title})"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(epochs[0]..x_max, 0.0..loss_max)?;
    chart.configure_mesh().x_desc("epoch").y_desc("loss").draw()?;
    chart.draw_series(LineSeries::new(r.epochs.iter().map(|e| (e.epoch as f64, e.loss)), &RED))?;

    let mut chart = ChartBuilder::on(&right).caption("accuracy", ("sans-serif", 20)).margin(15).x_label_area_size(35).y_label_area_size(50).build_cartesian_2d(epochs[0]..x_max, 0.0..1.0)?;
    chart.configure_mesh().x_desc("epoch").y_desc("accuracy").draw()?;
    for (name, color, get) in [("train", BLUE, (|e: &actors::EpochReport| e.train_acc) as fn(&actors::EpochReport) -> f64), ("valid", GREEN, |e| e.valid_acc), ("test", BLACK, |e| e.test_acc)] {
        chart.draw_series(LineSeries::new(r.epochs.iter().map(|e| (e.epoch as f64, get(e))), &color))?.label(name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).position(SeriesLabelPosition::LowerRight).draw()?;
    root.present()?;
    Ok(())
}
