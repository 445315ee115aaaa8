//! `hetgnn plot`: loss and accuracy curves of a run report (MRR and Hits@10
//! for link prediction), as a PNG.

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
    register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("bundled font is invalid"))?;
    // Drawn under a temporary name and moved into place whole.
    let file = graphs::atomic::AtomicFile::create(out)?;
    draw(&r, file.temp_path())
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing {}", out.display()))?;
    file.commit()?;
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

    let losses = loss_series(r);
    let loss_max = losses
        .iter()
        .flat_map(|(_, v)| v.iter().map(|&(_, y)| y))
        .filter(|l| l.is_finite())
        .fold(0.0, f64::max)
        * 1.05
        + 1e-9;
    let mut chart = ChartBuilder::on(&left)
        .caption(format!("training loss ({title})"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(epochs[0]..x_max, 0.0..loss_max)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("loss")
        .draw()?;
    let several = losses.len() > 1;
    for ((name, points), color) in losses.into_iter().zip([RED, BLUE, GREEN, BLACK]) {
        chart
            .draw_series(LineSeries::new(points, &color))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    if several {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }

    let panel = metrics(r);
    let y_max = match panel.fit {
        Some(cap) => panel
            .series
            .iter()
            .flat_map(|(_, v)| v.iter().map(|&(_, y)| y))
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max)
            .mul_add(1.1, 1e-3)
            .min(cap),
        None => 1.0,
    };
    let mut chart = ChartBuilder::on(&right)
        .caption(panel.caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(epochs[0]..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc(panel.caption)
        .draw()?;
    for ((name, points), color) in panel.series.into_iter().zip([BLUE, GREEN, BLACK, RED]) {
        chart
            .draw_series(LineSeries::new(points, &color))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The left-hand panel's curves: the loss trained on, then (multi-task)
/// each task's own loss, as (legend, (epoch, loss) points).
fn loss_series(r: &Report) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out = vec![(
        "trained on".to_string(),
        r.epochs.iter().map(|e| (e.epoch as f64, e.loss)).collect(),
    )];
    let names = r.epochs.first().map_or(&[][..], |e| &e.tasks[..]);
    for (k, t) in names.iter().enumerate() {
        let points = r
            .epochs
            .iter()
            .filter_map(|e| e.tasks.get(k).map(|t| (e.epoch as f64, t.loss)))
            .collect();
        out.push((t.task.clone(), points));
    }
    out
}

/// The right-hand panel: accuracies, a link-prediction run's ranking
/// metrics, or a regression run's errors.
struct Panel {
    caption: &'static str,
    /// The y axis: `None`, 0 to 1; else fitted to the curves, at most this.
    fit: Option<f64>,
    /// Per curve: its legend and its (epoch, value) points (epochs not evaluated have none).
    series: Vec<(&'static str, Vec<(f64, f64)>)>,
}

/// What the right-hand panel of `r` shows: for a link-prediction run (whose
/// accuracies are all 0) its validation and test MRR and test Hits@10; for a
/// regression run its validation and test RMSE and test MAE; for a
/// multi-label run its validation and test micro F1 and test average precision.
fn metrics(r: &Report) -> Panel {
    let curve = |get: fn(&actors::EpochReport) -> Option<f64>| {
        r.epochs
            .iter()
            .filter_map(|e| get(e).map(|y| (e.epoch as f64, y)))
            .collect::<Vec<_>>()
    };
    if r.epochs.iter().any(|e| e.link.is_some()) {
        return Panel {
            caption: "link prediction",
            fit: Some(1.0),
            series: vec![
                ("valid MRR", curve(|e| e.link.map(|l| l.valid.mrr))),
                ("test MRR", curve(|e| e.link.map(|l| l.test.mrr))),
                ("test Hits@10", curve(|e| e.link.map(|l| l.test.hits10))),
            ],
        };
    }
    if r.epochs.iter().any(|e| e.regression.is_some()) {
        return Panel {
            caption: "regression error",
            fit: Some(f64::INFINITY),
            series: vec![
                ("valid RMSE", curve(|e| e.regression.map(|v| v.valid.rmse))),
                ("test RMSE", curve(|e| e.regression.map(|v| v.test.rmse))),
                ("test MAE", curve(|e| e.regression.map(|v| v.test.mae))),
            ],
        };
    }
    if r.epochs.iter().any(|e| e.micro_f1.is_some()) {
        return Panel {
            caption: "multi-label",
            fit: None,
            series: vec![
                ("valid micro F1", curve(|e| e.micro_f1.map(|f| f[0]))),
                ("test micro F1", curve(|e| e.micro_f1.map(|f| f[1]))),
                ("test AP", curve(|e| e.average_precision.map(|f| f[1]))),
            ],
        };
    }
    Panel {
        caption: "accuracy",
        fit: None,
        series: vec![
            ("train", curve(|e| Some(e.train_acc))),
            ("valid", curve(|e| e.valid_acc)),
            ("test", curve(|e| e.test_acc)),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actors::task::link::{LinkEpoch, LinkMetrics};

    #[test]
    fn a_multi_task_report_plots_each_tasks_loss_beside_the_sum() {
        let mut r = Report::default();
        for (i, (c, v)) in [(2.0, 1.0), (1.5, 0.5)].into_iter().enumerate() {
            let task = |name: &str, weight, loss| actors::report::TaskEpoch {
                task: name.to_string(),
                weight,
                loss,
                ..Default::default()
            };
            r.epochs.push(actors::EpochReport {
                epoch: i as u64,
                loss: c + 0.5 * v,
                tasks: vec![
                    task("node-classification", 1.0, c),
                    task("node-regression", 0.5, v),
                ],
                ..Default::default()
            });
        }
        let s = loss_series(&r);
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["trained on", "node-classification", "node-regression"]
        );
        assert_eq!(s[0].1, vec![(0.0, 2.5), (1.0, 1.75)]);
        assert_eq!(s[2].1, vec![(0.0, 1.0), (1.0, 0.5)]);
        // One task: the loss alone.
        r.epochs.iter_mut().for_each(|e| e.tasks.clear());
        assert_eq!(loss_series(&r).len(), 1);
    }

    #[test]
    fn a_link_prediction_report_plots_its_ranking_metrics() {
        let mut r = Report::default();
        for (i, mrr) in [0.02, 0.05].into_iter().enumerate() {
            let m = LinkMetrics {
                mrr,
                hits1: 0.0,
                hits10: 2.0 * mrr,
                hits100: 0.5,
            };
            r.epochs.push(actors::EpochReport {
                epoch: i as u64,
                link: Some(LinkEpoch {
                    valid: m,
                    test: LinkMetrics {
                        mrr: mrr + 0.01,
                        ..m
                    },
                }),
                ..Default::default()
            });
        }
        let p = metrics(&r);
        assert_eq!(p.fit, Some(1.0));
        assert_eq!(
            p.series,
            vec![
                ("valid MRR", vec![(0.0, 0.02), (1.0, 0.05)]),
                ("test MRR", vec![(0.0, 0.03), (1.0, 0.060000000000000005)]),
                ("test Hits@10", vec![(0.0, 0.04), (1.0, 0.1)])
            ]
        );
        // A node-classification report keeps its accuracies, at the epochs it evaluated.
        r.epochs
            .iter_mut()
            .for_each(|e| (e.link, e.test_acc) = (None, Some(0.7)));
        r.epochs[0].test_acc = None;
        let p = metrics(&r);
        assert_eq!(p.fit, None);
        assert_eq!(p.series[2], ("test", vec![(1.0, 0.7)]));
        // A regression report plots its errors, on an axis not capped at 1.
        let m = |rmse| actors::task::node::ValueMetrics {
            rmse,
            mae: rmse / 2.0,
            r2: 0.5,
        };
        r.epochs[1].regression = Some(actors::task::node::RegressionEpoch {
            valid: m(3.0),
            test: m(4.0),
        });
        let p = metrics(&r);
        assert_eq!(p.fit, Some(f64::INFINITY));
        assert_eq!(p.series[1], ("test RMSE", vec![(1.0, 4.0)]));
        assert_eq!(p.series[2], ("test MAE", vec![(1.0, 2.0)]));
    }
}
