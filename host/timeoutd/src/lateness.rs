//! Lateness figures as the demo and the bench report them.

/// The nearest-rank `q` quantile (0 < q ≤ 1) of `sorted` (ascending), e.g. `q = 0.99` for p99:
/// the smallest value with at least q·n values at or below it. 0 for an empty slice.
pub fn nearest_rank(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::nearest_rank;

    #[test]
    fn nearest_rank_picks_the_smallest_value_covering_the_quantile() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 0.5), 50);
        assert_eq!(nearest_rank(&v, 0.99), 99);
        assert_eq!(nearest_rank(&v, 1.0), 100);
        assert_eq!(nearest_rank(&[7], 0.99), 7);
        assert_eq!(nearest_rank(&[], 0.5), 0);
    }
}
