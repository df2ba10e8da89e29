//! The overload matrix in the deterministic simulator (see `tests/sim`):
//! the real engine on a paused clock against modelled backends, beside an
//! oracle that knows each backend's true capacity.

mod sim;

use std::time::Duration;

use sim::matrix::{run_row, scenario, Pool, Shape, SERVICES};
use sim::run::Limit;

const DEADLINE: Option<Duration> = Some(Duration::from_millis(250));

#[actix_rt::test]
async fn probe_matrix() {
    tokio::time::pause();
    let mut rows = Vec::new();
    for svc in SERVICES {
        for x in [0.5, 2.0] {
            let s = scenario(
                Pool::Equal,
                svc,
                Shape::Steady(x),
                DEADLINE,
                0.0,
                Duration::from_secs(6),
            );
            rows.push(run_row(&s, Limit::Auto, 1, None).await);
        }
    }
    println!("{}", sim::matrix::table(&rows));
}
