//! `llmgw ctl usage`: what API keys used, per day or summed.

use std::collections::BTreeMap;

use llmgw_api::paths;
use llmgw_api::usage::{UsageDay, UsageTotals};
use reqwest::Method;

use crate::args::{OutputFormat, UsageGrouping};
use crate::client::{AdminClient, CtlError};
use crate::run::show;
use crate::table::Table;

pub async fn run(
    client: &AdminClient,
    output: OutputFormat,
    days: u64,
    by: Option<UsageGrouping>,
    csv: bool,
) -> Result<String, CtlError> {
    let path = format!("{}?days={days}", paths::USAGE);
    let answer = client.call(Method::GET, &path, None).await?;
    if by.is_none() && !csv {
        return show(output, &answer, |rows: &Vec<UsageDay>| {
            render(&per_day(rows))
        });
    }
    let rows: Vec<UsageDay> = answer.decode()?;
    let lines = match by {
        None => per_day(&rows),
        Some(by) => summed(&rows, by),
    };
    Ok(if csv { to_csv(&lines) } else { render(&lines) })
}

/// A table's lines: the columns that name the row, then the totals.
struct Lines {
    header: Vec<&'static str>,
    rows: Vec<(Vec<String>, UsageTotals)>,
}

fn per_day(rows: &[UsageDay]) -> Lines {
    Lines {
        header: vec!["DAY", "KEY", "TEAM", "MODEL"],
        rows: rows
            .iter()
            .map(|r| {
                (
                    vec![
                        r.day.clone(),
                        r.key.clone(),
                        r.team.clone(),
                        r.model.clone(),
                    ],
                    r.totals,
                )
            })
            .collect(),
    }
}

fn summed(rows: &[UsageDay], by: UsageGrouping) -> Lines {
    let mut sums: BTreeMap<String, UsageTotals> = BTreeMap::new();
    for row in rows {
        let name = match by {
            UsageGrouping::Key => &row.key,
            UsageGrouping::Team => &row.team,
            UsageGrouping::Model => &row.model,
        };
        sums.entry(name.clone()).or_default().add(&row.totals);
    }
    let header = match by {
        UsageGrouping::Key => "KEY",
        UsageGrouping::Team => "TEAM",
        UsageGrouping::Model => "MODEL",
    };
    Lines {
        header: vec![header],
        rows: sums.into_iter().map(|(name, t)| (vec![name], t)).collect(),
    }
}

const TOTAL_COLUMNS: [&str; 8] = [
    "REQUESTS",
    "CANCELLED",
    "FAILED",
    "PROMPT_TOKENS",
    "COMPLETION_TOKENS",
    "CACHED_TOKENS",
    "ESTIMATED",
    "COST_USD",
];

fn totals_cells(t: &UsageTotals) -> Vec<String> {
    let mut cells: Vec<String> = [
        t.requests(),
        t.cancelled,
        t.failed,
        t.prompt_tokens,
        t.completion_tokens,
        t.cached_tokens,
        t.estimated,
    ]
    .iter()
    .map(u64::to_string)
    .collect();
    // Plain dollars, so spreadsheets read the CSV column as a number.
    cells.push(format!("{:.6}", t.cost.dollars()));
    cells
}

fn render(lines: &Lines) -> String {
    let mut header = lines.header.clone();
    header.extend(TOTAL_COLUMNS);
    let mut table = Table::new(&header);
    for (names, totals) in &lines.rows {
        let mut cells: Vec<String> = names
            .iter()
            .map(|n| if n.is_empty() { "-".into() } else { n.clone() })
            .collect();
        cells.extend(totals_cells(totals));
        table.row(cells);
    }
    table.render()
}

fn to_csv(lines: &Lines) -> String {
    let field = |text: &str| {
        if text.contains([',', '"', '\n']) {
            format!("\"{}\"", text.replace('"', "\"\""))
        } else {
            text.to_owned()
        }
    };
    let mut out = String::new();
    let header: Vec<String> = lines
        .header
        .iter()
        .chain(TOTAL_COLUMNS.iter())
        .map(|h| h.to_ascii_lowercase())
        .collect();
    out.push_str(&header.join(","));
    out.push('\n');
    for (names, totals) in &lines.rows {
        let mut cells: Vec<String> = names.iter().map(|n| field(n)).collect();
        cells.extend(totals_cells(totals));
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(day: &str, key: &str, team: &str, model: &str, prompt: u64) -> UsageDay {
        UsageDay {
            day: day.into(),
            key: key.into(),
            team: team.into(),
            model: model.into(),
            totals: UsageTotals {
                completed: 2,
                cancelled: 1,
                prompt_tokens: prompt,
                cost: llmgw_api::keys::Usd::from_micros(prompt * 125),
                ..UsageTotals::default()
            },
        }
    }

    #[test]
    fn summed_by_team_and_written_as_csv() {
        let rows = vec![
            day("2026-12-05", "ci", "search", "qwen", 10),
            day("2026-12-06", "ci", "search", "llama", 5),
            day("2026-12-06", "batch", "ads, emea", "qwen", 1),
        ];
        let csv = to_csv(&summed(&rows, UsageGrouping::Team));
        assert_eq!(
            csv,
            "team,requests,cancelled,failed,prompt_tokens,completion_tokens,cached_tokens,estimated,cost_usd\n\
             \"ads, emea\",3,1,0,1,0,0,0,0.000125\n\
             search,6,2,0,15,0,0,0,0.001875\n"
        );
        let table = render(&per_day(&rows));
        assert!(
            table.lines().nth(1).unwrap().starts_with("2026-12-05  ci"),
            "{table}"
        );
    }
}
